// `metrale check`: the CUDA backend against the CPU reference over a small
// matrix of formats, batch shapes and split counts: cache bytes must be
// bit-identical (one set of quantizers, SYSTEM.md 2) and decode outputs
// within 1e-2 rel. L2 per (sequence, head). Without a usable GPU it says
// it was skipped and exits 0 (so scripts can call it anywhere).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <memory>

#include "bench/lib/bench_util.hpp"
#include "decode_batch.hpp"
#include "kv_setup.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "progress.hpp"
#include "subcommands.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

struct Options {
  std::vector<KvFormat> formats = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};
  uint64_t seed = 1;
  OutputFiles out;
};

struct Case {
  int32_t seqs, max_len, splits;  // splits 0 = the planner's choice
};

int run(const Options& o) {
  std::string reason;
  if (pick_backend(false, &reason) != "cuda") {
    std::printf("metrale check: skipped: %s\n", reason.c_str());
    o.out.write({{"command", "check"}, {"skipped", true}, {"reason", reason}}, {"skipped", "reason"},
                {{"true", reason}});
    return 0;
  }
  const cuda::DeviceInfo dev = cuda::device_info();
  std::printf("metrale check: GPU (%s) against the CPU reference backend\n\n", dev.name.c_str());
  const Case cases[] = {{1, 1000, 0}, {4, 3000, 0}, {4, 3000, 5}, {16, 513, 0}, {33, 200, 2}};
  LayerShape shape;
  TextTable t({"format", "seqs", "max len", "splits", "caches", "max err", "result"});
  std::vector<std::vector<std::string>> csv;
  nlohmann::json rows = nlohmann::json::array();
  int failures = 0;
  Progress bar("check", int64_t(o.formats.size() * std::size(cases)));
  int64_t done = 0;
  for (KvFormat f : o.formats) {
    for (const Case& c : cases) {
      const HostBatch b = make_batch(shape, c.seqs, c.max_len, o.seed + uint64_t(done));
      float ka = 0.0f, va = 0.0f;
      cpu::bf16_absmax(b.key.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &ka);
      cpu::bf16_absmax(b.value.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &va);
      const KvScales sc = scales_from_absmax(f, ka, va);
      const BatchDecode ref = decode_batch_cpu(b, f, sc, c.splits);
      const BatchDecode gpu = decode_batch_gpu(b, f, sc, c.splits);
      const bool same_cache = ref.k_cache == gpu.k_cache && ref.v_cache == gpu.v_cache;
      const double err = bench::max_rel_l2(gpu.out.data(), ref.out.data(), ref.out.size(), shape.head_dim);
      const bool ok = same_cache && err <= 1e-2;
      failures += !ok;
      t.add_row({to_string(f), std::to_string(c.seqs), std::to_string(c.max_len), std::to_string(gpu.num_splits),
                 same_cache ? "identical" : "DIFFER", format("%.2e", err), ok ? "ok" : "FAIL"});
      csv.push_back({to_string(f), std::to_string(c.seqs), std::to_string(c.max_len), std::to_string(gpu.num_splits),
                     same_cache ? "1" : "0", format("%.6e", err), ok ? "ok" : "FAIL"});
      rows.push_back({{"format", to_string(f)},
                      {"seqs", c.seqs},
                      {"max_len", c.max_len},
                      {"splits", gpu.num_splits},
                      {"caches_identical", same_cache},
                      {"max_rel_l2", err},
                      {"ok", ok}});
      bar.update(++done);
    }
  }
  bar.finish();
  std::fputs(t.render().c_str(), stdout);
  std::printf(
      "\ncaches: K/V cache bytes written by the GPU vs the CPU (must be identical); max err: worst rel. L2\n"
      "  of the GPU output against the CPU's per (sequence, head) (bound 1e-2). %d of %zu failed.\n",
      failures, rows.size());
  nlohmann::json j = {
      {"command", "check"}, {"skipped", false}, {"device", dev.name}, {"rows", rows}, {"failures", failures}};
  o.out.write(j, {"format", "seqs", "max_len", "splits", "caches_identical", "max_rel_l2", "result"}, csv);
  return failures ? 1 : 0;
}

}  // namespace

void add_check_command(CLI::App& app, int* status) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "check", "GPU against the CPU reference over a small shape matrix (skipped, exit 0, without a GPU)");
  add_formats_option(sub, &o->formats);
  sub->add_option("--seed", o->seed, "Seed of the batches")->capture_default_str();
  o->out.add_to(sub);
  sub->callback([o, status] { *status = run(*o); });
}

}  // namespace metrale::cli
