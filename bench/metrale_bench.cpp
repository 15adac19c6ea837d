// metrale_bench: the benchmark CLI (check / perf / oracle modes).
//
//   perf    time decode (planner's split choice, or --splits) or the cache
//           write; report us, GB/s and the fraction of the read ceiling
//           measured in the same run
//   oracle  sweep num_splits per shape and show the planner's pick beside
//           the best measured
//   check   GPU decode against the CPU reference backend on each shape
// Bytes counted: K, V and scales of the attended range (decode); bf16 rows
// read plus codes and scales written (cache write).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/bench_util.hpp"
#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "src/plan/tuning.hpp"
#include "testing/forced_plans.hpp"

namespace {

using namespace metrale;
using metrale::bench::DecodeShape;
using metrale::bench::DecodeWorkload;
using metrale::bench::kRotationBytes;
constexpr auto& cuda_ok = metrale::test::cuda_check;  // testing/cuda_check.hpp
using metrale::bench::split_list;

struct Row {
  std::string op, shape, note, plan;
  int splits = 0;
  double us = 0, gbps = 0, frac = 0, err = -1;
};

// Times the decode of `w` with `plan` (cycling replicas inside one graph).
double time_decode(const DecodeWorkload& w, const AttnPlan& plan, bf16* out, float* ws, size_t ws_bytes) {
  const int per_graph = std::max(w.replicas(), std::min(20, 4 * w.replicas()));
  return metrale::bench::median_us_per_call(
      [&](int call, cudaStream_t s) {
        cuda::run_attention(plan, w.args(call % w.replicas(), out), SplitKWorkspace{ws, ws_bytes, plan.num_splits}, s);
      },
      per_graph);
}

// The plan's decisions, as the rows report them.
std::string describe(const AttnPlan& plan) {
  return std::string(to_string(plan.merge)) + " " + detail::to_string(plan.launch.load_path) +
         (plan.launch.pair_kv_heads ? " paired" : "");
}

// The command line.
struct Flags {
  std::string mode = "perf", op = "decode", formats = "bf16,fp8,nvfp4";
  std::string shapes = "1x1024,1x32768,16x8192,64x4096,128x2048,256x1024,32x32768";
  std::string heads = "32/8", csv_path, json_path, nvfp4_scales = "max6";
  std::string pairing = "automatic", load_path = "automatic", merge = "automatic";
  int head_dim = 128, block_size = 16, forced_splits = 0, window = 0, q_len = 1, col_tiles = 0, head_dim_parts = 0;
  bool mixed = false;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--mode", f.mode, "perf | oracle | check")->check(CLI::IsMember({"perf", "oracle", "check"}));
  app.add_option("--op", f.op, "decode | write")->check(CLI::IsMember({"decode", "write"}));
  app.add_option("--formats", f.formats, "comma list of bf16, fp8, nvfp4");
  app.add_option("--shapes", f.shapes, "comma list of BATCHxCONTEXT");
  app.add_option("--heads", f.heads, "QHEADS/KVHEADS");
  app.add_option("--head-dim", f.head_dim)->check(CLI::IsMember({64, 128, 256}));
  app.add_option("--block-size", f.block_size)->check(CLI::IsMember({16, 32, 64, 128}));
  // Plan options (AttnPlanOptions): A/B runs force one decision at a time.
  app.add_option("--splits", f.forced_splits, "force num_splits (0 = planner)");
  app.add_option("--pairing", f.pairing, "automatic | off | on (kv-head pairs at head_dim 64)")
      ->check(CLI::IsMember({"automatic", "off", "on"}));
  app.add_option("--load-path", f.load_path, "automatic | registers | tma")
      ->check(CLI::IsMember({"automatic", "registers", "tma"}));
  app.add_option("--merge", f.merge, "automatic | single_pass | cluster | workspace")
      ->check(CLI::IsMember({"automatic", "single_pass", "cluster", "workspace"}));
  app.add_option("--window", f.window, "sliding window (0 = off)");
  app.add_flag("--mixed", f.mixed, "lengths uniform in [1, CONTEXT]");
  app.add_option("--q-len", f.q_len, "query rows per sequence (> 1: query runs through run_attention, docs/spec.md 8)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--col-tiles", f.col_tiles, "runs kernel: n-tiles of 8 columns per CTA (0 = planner, 1, 2)")
      ->check(CLI::Range(0, 2));
  app.add_option("--head-dim-parts", f.head_dim_parts,
                 "runs kernel: 0 = planner, 1, 2 = head_dim split over teams of two warps (NVFP4)")
      ->check(CLI::Range(0, 2));
  app.add_option("--nvfp4-scales", f.nvfp4_scales,
                 "--op write: comma list of NVFP4 group-scale rules (max6, adaptive; docs/nvfp4_scales.md), one "
                 "row each and their time ratio; decode does not depend on the rule");
  app.add_option("--csv", f.csv_path, "write rows as CSV");
  app.add_option("--json", f.json_path, "write rows as JSON");
}

// What every shape's rows share: the flags, the NVFP4 rules of the write
// rows, the plan knobs, the target and the read ceiling.
struct Bench {
  Flags f;
  std::vector<Nvfp4ScaleRule> rules;
  AttnPlanOptions options;
  detail::TuningOptions tuning;
  // The runs kernel's tiling applies to the q_len > 1 plan only (the q_len 1
  // decode plan beside it keeps the decode kernel's).
  detail::TuningOptions runs_tuning;
  AttnTarget target;
  int qh = 32, kvh = 8;
  double ceiling = 0.0;
};

// One shape's workload, its decode plan and the buffers its rows use.
struct ShapeRun {
  const Bench& b;
  const DecodeShape& s;
  const DecodeWorkload& w;
  const AttnProblem& prob;
  const AttnPlan& plan;
  bf16* out;
  float* ws;
  size_t max_ws;

  Row row(int32_t splits, double us) const {
    Row r;
    r.op = b.f.op;
    r.shape = s.name();
    r.splits = splits;
    r.us = us;
    r.gbps = w.attended_bytes() / (us * 1e3);
    r.frac = r.gbps / b.ceiling;
    return r;
  }
  // The planner's own choice of splits with the forced options otherwise (oracle mode).
  AttnPlan plan_with_splits(int32_t ns) const {
    AttnPlanOptions o = b.options;
    o.num_splits = ns;
    return detail::plan_attention(prob, b.target, o, b.tuning);
  }
};

// Cache write of one new token per sequence x 64 steps' worth of tokens: a
// row per NVFP4 group-scale rule (the rule is the layout's), the others
// once. Each of the graph's kSets calls takes its own input set and slot
// mapping, so (as in the decode rows) a call's bf16 rows come from HBM, not
// from L2 where the previous call left them.
std::vector<Row> write_rows(const ShapeRun& run, const std::string& format_name) {
  const Bench& b = run.b;
  constexpr int kSets = 10;
  const int64_t tokens = std::max<int64_t>(int64_t(run.s.num_seqs) * 64, 4096);
  const int32_t row_len = b.kvh * b.f.head_dim;
  const size_t set_elems = size_t(tokens) * row_len;
  bf16 *key = nullptr, *value = nullptr;
  int64_t* slots = nullptr;
  cuda_ok(cudaMalloc(&key, kSets * set_elems * sizeof(bf16)), "cudaMalloc(key)");
  cuda_ok(cudaMalloc(&value, kSets * set_elems * sizeof(bf16)), "cudaMalloc(value)");
  // Model-like values (roughly normal, a few large ones), so that the
  // NVFP4 groups' scales vary as a model's do (a constant fill gives
  // every group one scale and the quantizers their easiest path).
  metrale::bench::random_bf16(key, int64_t(kSets * set_elems), row_len, 11);
  metrale::bench::random_bf16(value, int64_t(kSets * set_elems), row_len, 12);
  cuda_ok(cudaMalloc(&slots, kSets * tokens * sizeof(int64_t)), "cudaMalloc(slots)");
  const AttnArgs a = run.w.args(0, run.out);
  const int64_t cap = a.cache.layout.capacity_slots();
  std::vector<int64_t> hs(size_t(kSets) * tokens);
  for (int64_t t = 0; t < kSets * tokens; ++t) hs[size_t(t)] = (t * 7919) % cap;
  cuda_ok(cudaMemcpy(slots, hs.data(), hs.size() * 8, cudaMemcpyHostToDevice), "slots");
  CacheWriteArgs wa;
  wa.key_stride = wa.value_stride = row_len;
  wa.num_tokens = tokens;
  wa.cache = a.cache;
  const bool nvfp4 = run.s.format == KvFormat::nvfp4;
  const std::vector<Nvfp4ScaleRule> write_rules = nvfp4 ? b.rules : std::vector<Nvfp4ScaleRule>{Nvfp4ScaleRule::max6};
  std::vector<Row> rows;
  double max6_us = 0.0;
  for (const Nvfp4ScaleRule rule : write_rules) {
    wa.cache.layout = a.cache.layout.with_nvfp4_scales(rule);
    const double us = metrale::bench::median_us_per_call(
        [&](int call, cudaStream_t st) {
          const size_t set = size_t(call);
          CacheWriteArgs c = wa;
          c.key = key + set * set_elems;
          c.value = value + set * set_elems;
          c.slot_mapping = slots + set * tokens;
          cuda::reshape_and_cache(c, st);
        },
        kSets);
    Row r = run.row(0, us);
    const double bytes = double(tokens) * (2.0 * row_len * 2 + a.cache.layout.kv_bytes_per_token()) + tokens * 8;
    r.shape = format_name + (nvfp4 ? std::string(" ") + to_string(rule) : "") + " write " + std::to_string(tokens) +
              " tokens " + b.f.heads + " d" + std::to_string(b.f.head_dim);
    r.gbps = bytes / (us * 1e3);
    r.frac = r.gbps / b.ceiling;
    if (rule == Nvfp4ScaleRule::max6) max6_us = us;
    if (rule == Nvfp4ScaleRule::adaptive && max6_us > 0.0) {
      char note[48];
      std::snprintf(note, sizeof note, "%.3fx max6's time", us / max6_us);
      r.note = note;
    }
    rows.push_back(r);
  }
  cudaFree(key);
  cudaFree(value);
  cudaFree(slots);
  return rows;
}

// q_len query rows per sequence at the end of its cache (speculative
// verification), through run_attention; q rows and outputs of their own.
Row runs_row(const ShapeRun& run) {
  const Bench& b = run.b;
  const int32_t q_len = b.f.q_len, head_dim = b.f.head_dim, qh = b.qh;
  const int32_t nrows = run.s.num_seqs * q_len;
  std::vector<int32_t> qs(size_t(run.s.num_seqs) + 1);
  for (int32_t i = 0; i <= run.s.num_seqs; ++i) qs[size_t(i)] = i * q_len;
  bf16 *q = nullptr, *rout = nullptr;
  int32_t* q_start = nullptr;
  cuda_ok(cudaMalloc(&q, size_t(nrows) * qh * head_dim * sizeof(bf16)), "cudaMalloc(q)");
  cuda_ok(cudaMemset(q, 0x3c, size_t(nrows) * qh * head_dim * sizeof(bf16)), "memset(q)");
  cuda_ok(cudaMalloc(&rout, size_t(nrows) * qh * head_dim * sizeof(bf16)), "cudaMalloc(out)");
  cuda_ok(cudaMalloc(&q_start, qs.size() * sizeof(int32_t)), "cudaMalloc(q_start)");
  cuda_ok(cudaMemcpy(q_start, qs.data(), qs.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "q_start");
  auto runs_args = [&](int replica) {
    return run.w.runs_args(replica, rout, q, int64_t(qh) * head_dim, q_start, nrows);
  };
  const AttnPlan rplan = detail::plan_attention(attention_problem(runs_args(0), run.w.max_seq_len(), q_len), b.target,
                                                b.options, b.runs_tuning);
  float* rws = nullptr;
  cuda_ok(cudaMalloc(&rws, std::max<size_t>(rplan.workspace_bytes, 16)), "cudaMalloc(workspace)");
  const int per_graph = std::max(run.w.replicas(), std::min(20, 4 * run.w.replicas()));
  const double us = metrale::bench::median_us_per_call(
      [&](int call, cudaStream_t st) {
        cuda::run_attention(rplan, runs_args(call % run.w.replicas()),
                            SplitKWorkspace{rws, rplan.workspace_bytes, rplan.num_splits}, st);
      },
      per_graph);
  Row r = run.row(rplan.num_splits, us);
  r.shape += " q" + std::to_string(q_len);
  r.plan = describe(rplan) + " tiles " + std::to_string(rplan.launch.head_tiles) + "x" +
           std::to_string(8 * rplan.launch.col_tiles) + (rplan.launch.head_dim_parts == 2 ? " halves" : "");
  cudaFree(q);
  cudaFree(rout);
  cudaFree(q_start);
  cudaFree(rws);
  return r;
}

// The planner's split count against every count tried.
Row oracle_row(const ShapeRun& run) {
  double best_us = 1e30;
  int32_t best = 1;
  for (int32_t ns : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
    if (ns > (run.w.max_seq_len() + run.b.f.block_size - 1) / run.b.f.block_size && ns > 1) break;
    const double us = time_decode(run.w, run.plan_with_splits(ns), run.out, run.ws, run.max_ws);
    if (us < best_us) best_us = us, best = ns;
  }
  const AttnPlan planned = run.plan_with_splits(0);
  Row r = run.row(planned.num_splits, time_decode(run.w, planned, run.out, run.ws, run.max_ws));
  r.plan = describe(planned);
  char note[96];
  std::snprintf(note, sizeof note, "best: %d splits %.1f us (planner %+.1f%%)", best, best_us,
                100.0 * (r.us / best_us - 1));
  r.note = note;
  return r;
}

// The GPU decode against the CPU reference backend.
Row check_row(const ShapeRun& run) {
  const int32_t ns = run.plan.num_splits;
  cuda::run_attention(run.plan, run.w.args(0, run.out), SplitKWorkspace{run.ws, run.max_ws, ns});
  std::vector<bf16> gpu(size_t(run.s.num_seqs) * run.b.qh * run.b.f.head_dim), ref(gpu.size());
  cuda_ok(cudaMemcpy(gpu.data(), run.out, gpu.size() * 2, cudaMemcpyDeviceToHost), "download out");
  DecodeWorkload::HostCopy h = run.w.download_replica0();
  AttnArgs a = run.w.args(0, ref.data());
  a.q = h.q.data();
  a.cache.k = h.k.data();
  a.cache.v = h.v.data();
  a.block_tables = h.block_tables.data();
  a.seq_lens = h.seq_lens.data();
  test::cpu_single_pass(a);
  Row r = run.row(ns, 0);
  r.plan = describe(run.plan);
  r.us = r.gbps = r.frac = 0;
  r.err = metrale::bench::max_rel_l2(gpu.data(), ref.data(), gpu.size(), run.b.f.head_dim);
  r.note = r.err <= 1e-2 ? "ok" : "FAIL";
  return r;
}

// The rows of one shape ("BATCHxCONTEXT") of format `format_name`, by the
// flags' op and mode. `seed` draws the workload's data.
std::vector<Row> shape_rows(const Bench& b, const std::string& format_name, const std::string& shape, uint64_t seed) {
  DecodeShape s;
  try {
    s.format = kv_format_from_string(format_name);
  } catch (const InvalidArgument& e) {
    throw CLI::ValidationError("--formats", e.what());
  }
  if (std::sscanf(shape.c_str(), "%dx%d", &s.num_seqs, &s.seq_len) != 2) throw CLI::ValidationError("--shapes", shape);
  s.num_q_heads = b.qh;
  s.num_kv_heads = b.kvh;
  s.head_dim = b.f.head_dim;
  s.block_size = b.f.block_size;
  s.sliding_window = b.f.window;
  s.mixed_lengths = b.f.mixed;
  DecodeWorkload w(s, kRotationBytes, seed);
  const AttnProblem prob = attention_problem(w.args(0, nullptr), w.max_seq_len());
  const AttnPlan plan = detail::plan_attention(prob, b.target, b.options, b.tuning);
  const size_t max_ws = splitk_workspace_bytes(s.num_seqs, b.qh, b.f.head_dim, kMaxSplits);
  bf16* out = nullptr;
  float* ws = nullptr;
  cuda_ok(cudaMalloc(&out, size_t(s.num_seqs) * b.qh * b.f.head_dim * sizeof(bf16)), "cudaMalloc(out)");
  cuda_ok(cudaMalloc(&ws, max_ws), "cudaMalloc(workspace)");
  const ShapeRun run{b, s, w, prob, plan, out, ws, max_ws};
  std::vector<Row> rows;
  if (b.f.op == "write") {
    rows = write_rows(run, format_name);
  } else if (b.f.mode == "perf" && b.f.q_len > 1) {
    rows.push_back(runs_row(run));
  } else if (b.f.mode == "perf") {
    rows.push_back(run.row(plan.num_splits, time_decode(w, plan, out, ws, max_ws)));
    rows.back().plan = describe(plan);
  } else if (b.f.mode == "oracle") {
    rows.push_back(oracle_row(run));
  } else {
    rows.push_back(check_row(run));
  }
  cudaFree(out);
  cudaFree(ws);
  return rows;
}

void print_row(const Row& r) {
  std::printf("%-34s splits %3d  %9.1f us  %7.0f GB/s  %5.3f R  %-28s %s\n", r.shape.c_str(), r.splits, r.us, r.gbps,
              r.frac, r.plan.c_str(), r.err >= 0 ? (std::to_string(r.err) + " " + r.note).c_str() : r.note.c_str());
}

void write_csv(const std::string& path, const std::vector<Row>& rows, double ceiling, double empty_us) {
  std::ofstream f(path);
  f << "op,shape,splits,us,gbps,fraction_of_ceiling,ceiling_gbps,max_rel_err,note,empty_launch_us,plan\n";
  for (const Row& r : rows)
    f << r.op << ",\"" << r.shape << "\"," << r.splits << "," << r.us << "," << r.gbps << "," << r.frac << ","
      << ceiling << "," << r.err << ",\"" << r.note << "\"," << empty_us << ",\"" << r.plan << "\"\n";
}

void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& device, double ceiling,
                double empty_us) {
  nlohmann::json j;
  j["device"] = device;
  j["ceiling_gbps"] = ceiling;
  j["empty_launch_us"] = empty_us;
  for (const Row& r : rows)
    j["rows"].push_back({{"op", r.op}, {"shape", r.shape}, {"splits", r.splits}, {"us", r.us}, {"gbps", r.gbps},
                         {"fraction_of_ceiling", r.frac}, {"max_rel_err", r.err}, {"note", r.note},
                         {"plan", r.plan}});
  std::ofstream(path) << j.dump(2) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"metrale benchmark: paged decode and cache write on the GPU"};
  Bench b;
  add_flags(app, b.f);
  CLI11_PARSE(app, argc, argv);
  for (const std::string& r : split_list(b.f.nvfp4_scales)) {
    try {
      b.rules.push_back(nvfp4_scale_rule_from_string(r));
    } catch (const InvalidArgument& e) {
      std::fprintf(stderr, "metrale_bench: --nvfp4-scales: %s\n", e.what());
      return 1;
    }
  }

  if (!cuda::available()) {
    std::fprintf(stderr, "metrale_bench: no sm_90 GPU here; nothing to measure\n");
    return 2;
  }
  const cuda::DeviceInfo dev = cuda::device_info();
  b.ceiling = metrale::bench::measure_read_ceiling_gbps();
  const double empty_us = metrale::bench::empty_launch_us();
  std::printf("# %s, %d SMs; read ceiling R = %.0f GB/s (16-byte loads, 1 GiB windows, graph replay); "
              "empty kernel %.2f us per launch\n",
              dev.name.c_str(), dev.num_sms, b.ceiling, empty_us);

  b.options.num_splits = b.f.forced_splits;
  b.options.merge = split_merge_from_string(b.f.merge);  // the names CLI11 checked above
  b.tuning.pairing = detail::toggle_from_string(b.f.pairing, "pairing");
  b.tuning.load_path = detail::load_path_from_string(b.f.load_path);
  b.runs_tuning = b.tuning;
  b.runs_tuning.col_tiles = b.f.col_tiles;
  b.runs_tuning.head_dim_parts = b.f.head_dim_parts;
  b.target = cuda::attention_target();
  if (std::sscanf(b.f.heads.c_str(), "%d/%d", &b.qh, &b.kvh) != 2) throw CLI::ValidationError("--heads", b.f.heads);
  std::vector<Row> rows;
  for (const std::string& fs : split_list(b.f.formats)) {
    for (const std::string& sh : split_list(b.f.shapes)) {
      for (const Row& r : shape_rows(b, fs, sh, 1234 + rows.size())) {
        print_row(r);
        rows.push_back(r);
      }
      std::fflush(stdout);
    }
  }
  if (!b.f.csv_path.empty()) write_csv(b.f.csv_path, rows, b.ceiling, empty_us);
  if (!b.f.json_path.empty()) write_json(b.f.json_path, rows, dev.name, b.ceiling, empty_us);
  bool failed = false;
  for (const Row& r : rows) failed |= r.note == "FAIL";
  return failed ? 1 : 0;
}
