// `metrale bench`: a thin decode benchmark. On a GPU it runs the shapes of
// metrale_bench --mode perf through the same bench/lib code (DecodeWorkload,
// CUDA-graph replay over L2-defeating replicas, a read ceiling measured in
// the same run); on the CPU it times the reference backend on smaller
// batches (lengths mixed up to the context). CSV columns are metrale_bench's,
// so tools/plot_results.py reads both.
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>

#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "decode_batch.hpp"
#include "device_buffer.hpp"
#include "kv_setup.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"
#include "progress.hpp"
#include "subcommands.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

struct Options {
  std::vector<KvFormat> formats = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};
  std::vector<std::string> shapes;  // BATCHxCONTEXT; empty = the backend's defaults
  bool force_cpu = false;
  int reps = 5;
  OutputFiles out;
};

struct Row {
  std::string shape, note;
  int32_t splits = 1;
  double us = 0, gbps = 0, frac = 0;
};

// "64x4096" -> {64, 4096}; nullopt unless it is exactly BATCHxCONTEXT with both > 0.
std::optional<std::pair<int32_t, int32_t>> parse_shape(const std::string& s) {
  std::istringstream is(s);
  int32_t seqs = 0, len = 0;
  char x = 0;
  if ((is >> seqs >> x >> len) && x == 'x' && seqs > 0 && len > 0 && is.peek() == EOF) return std::make_pair(seqs, len);
  return std::nullopt;
}

Row gpu_row(KvFormat f, int32_t seqs, int32_t len, const cuda::DeviceInfo& dev, double ceiling) {
  bench::DecodeShape s;
  s.format = f;
  s.num_seqs = seqs;
  s.seq_len = len;
  const bench::DecodeWorkload w(s, bench::kRotationBytes, 1234);
  DecodeProblem problem;
  problem.num_seqs = seqs;
  problem.num_q_heads = s.num_q_heads;
  problem.layout = w.args(0, nullptr).cache.layout;
  problem.max_seq_len = w.max_seq_len();
  const DecodePlan plan = plan_decode(problem, dev.num_sms);
  DeviceBuffer ws(plan.workspace_bytes), out(size_t(seqs) * s.num_q_heads * s.head_dim * sizeof(bf16));
  const SplitKWorkspace workspace{ws.as<float>(), ws.bytes(), plan.num_splits};
  Row r;
  r.shape = s.name();
  r.splits = plan.num_splits;
  r.us = bench::median_us_per_call(
      [&](int call, cudaStream_t st) {
        cuda::run_decode(plan, w.args(call % w.replicas(), out.as<bf16>()), workspace, st);
      },
      std::max(w.replicas(), std::min(20, 4 * w.replicas())));
  r.gbps = w.attended_bytes() / (r.us * 1e3);
  r.frac = r.gbps / ceiling;
  return r;
}

Row cpu_row(KvFormat f, int32_t seqs, int32_t len, int reps) {
  const LayerShape shape;
  const HostBatch b = make_batch(shape, seqs, len, 1234);
  const BatchDecode d = decode_batch_cpu(b, f, scales_from_absmax(f, 24.0f, 2.0f), 0, reps);
  double tokens = 0;
  for (int32_t l : b.seq_lens) tokens += l;
  Row r;
  r.shape =
      format("%s %dx%d %d/%d d%d", to_string(f), seqs, len, shape.num_q_heads, shape.num_kv_heads, shape.head_dim);
  r.splits = d.num_splits;
  r.us = d.median_us;
  r.gbps = tokens * make_layout(f, shape, 1).kv_bytes_per_token() / (r.us * 1e3);
  r.note = "cpu, lengths mixed up to the context";
  return r;
}

int run(Options& o) {
  std::string reason;
  const bool gpu = pick_backend(o.force_cpu, &reason) == "cuda";
  if (o.shapes.empty())
    o.shapes =
        gpu ? std::vector<std::string>{"1x1024", "1x32768", "16x8192", "64x4096", "128x2048", "256x1024", "32x32768"}
            : std::vector<std::string>{"1x2048", "8x1024", "32x256"};
  double ceiling = 0;
  std::string device;
  cuda::DeviceInfo dev;
  if (gpu) {
    dev = cuda::device_info();
    ceiling = bench::measure_read_ceiling_gbps();
    device = dev.name;
    std::printf("metrale bench: decode on %s, %d SMs; read ceiling %.0f GB/s (same run)\n\n", dev.name.c_str(),
                dev.num_sms, ceiling);
  } else {
    device = format("CPU reference backend, %d threads", int(cpu::num_threads()));
    std::printf("metrale bench: decode on the %s (no GPU run: %s); median of %d\n\n", device.c_str(), reason.c_str(),
                o.reps);
  }
  std::fflush(stdout);
  std::vector<Row> rows;
  Progress bar("bench", int64_t(o.formats.size() * o.shapes.size()));
  for (KvFormat f : o.formats)
    for (const std::string& sh : o.shapes) {
      const auto [seqs, len] = *parse_shape(sh);  // validated by the option's check
      rows.push_back(gpu ? gpu_row(f, seqs, len, dev, ceiling) : cpu_row(f, seqs, len, o.reps));
      bar.update(int64_t(rows.size()));
    }
  bar.finish();

  std::vector<std::string> headers = {"shape", "splits", "us", "GB/s"};
  if (gpu) headers.push_back("of ceiling");
  TextTable t(headers);
  std::vector<std::vector<std::string>> csv;
  nlohmann::json jrows = nlohmann::json::array();
  for (const Row& r : rows) {
    std::vector<std::string> cells = {r.shape, std::to_string(r.splits), format("%.1f", r.us), format("%.1f", r.gbps)};
    if (gpu) cells.push_back(format("%.1f%%", 100 * r.frac));
    t.add_row(cells);
    csv.push_back({"decode", r.shape, std::to_string(r.splits), format("%g", r.us), format("%g", r.gbps),
                   gpu ? format("%g", r.frac) : "", gpu ? format("%g", ceiling) : "", "-1", r.note});
    jrows.push_back({{"op", "decode"},
                     {"shape", r.shape},
                     {"splits", r.splits},
                     {"us", r.us},
                     {"gbps", r.gbps},
                     {"fraction_of_ceiling", gpu ? nlohmann::json(r.frac) : nlohmann::json(nullptr)},
                     {"note", r.note}});
  }
  std::fputs(t.render().c_str(), stdout);
  std::printf("\nGB/s: K, V and scale bytes of the attended range / decode time%s.\n",
              gpu ? "; ceiling: a read-only kernel in the same run (metrale_bench has more modes)" : "");
  nlohmann::json j = {{"command", "bench"}, {"backend", gpu ? "cuda" : "cpu"}, {"device", device}, {"rows", jrows}};
  j["ceiling_gbps"] = gpu ? nlohmann::json(ceiling) : nlohmann::json(nullptr);
  o.out.write(j, {"op", "shape", "splits", "us", "gbps", "fraction_of_ceiling", "ceiling_gbps", "max_rel_err", "note"},
              csv);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int* status) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Decode timings per format and shape (GPU: the metrale_bench shapes; CPU: smaller batches)");
  add_formats_option(sub, &o->formats);
  sub->add_option("--shapes", o->shapes, "Comma list of BATCHxCONTEXT (default depends on the backend)")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& s) {
            return parse_shape(s) ? std::string() : "expected BATCHxCONTEXT, e.g. 64x4096, got '" + s + "'";
          },
          "BATCHxCONTEXT"));
  sub->add_flag("--cpu", o->force_cpu, "Use the CPU reference backend even when a GPU is usable");
  sub->add_option("--reps", o->reps, "CPU timing repetitions (median)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  o->out.add_to(sub);
  sub->callback([o, status] { *status = run(*o); });
}

}  // namespace metrale::cli
