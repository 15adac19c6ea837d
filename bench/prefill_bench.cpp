// prefill_bench: query runs over the paged cache at prefill shapes, timed
// through run_attention with the planner's plan (or a forced kernel):
// time, TFLOPS and the fraction of the dense BF16 tensor-core peak.
//
// Shapes (--shapes, comma list):
//   N        one prompt of N tokens (no cached prefix)
//   N+P      a chunk of N new tokens over a cached prefix of P tokens
//   BxN+P    B sequences, each a chunk of N over P (BxN: B prompts of N);
//            e.g. 1x16+32768 verifies 16 draft tokens over a 32768-token cache
//   ragged8  8 prompts of 512, 1024, ..., 4096 tokens in one batch
// FLOPs: 4 * head_dim * q heads * sum over query rows of the positions each
// attends (causal, aligned to the end of its sequence; the window bounds it).
// GB/s: the attended cache read once (the read ceiling's share for short
// chunks over a long prefix, which are memory-bound). --splits forces a split
// count (the prefill kernel's split-K through the workspace, with --prefill on).
// --check compares the plan's kernel with the other one (runs kernel with
// split-K, or the prefill kernel) at these long shapes, which the float64
// tests cannot reach (exit 1 on a difference over 2e-2 or a NaN).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bench/lib/bench_util.hpp"
#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "src/plan/tuning.hpp"

namespace {

using namespace metrale;
constexpr auto& cuda_ok = metrale::test::cuda_check;

struct Run {
  int32_t new_tokens, prefix;
};

std::vector<Run> parse_shape(const std::string& s) {
  if (s == "ragged8") {
    std::vector<Run> r;
    for (int i = 1; i <= 8; ++i) r.push_back({512 * i, 0});
    return r;
  }
  const size_t x = s.find('x');
  const int batch = x == std::string::npos ? 1 : std::stoi(s.substr(0, x));
  const std::string run = x == std::string::npos ? s : s.substr(x + 1);
  const size_t plus = run.find('+');
  const Run r = plus == std::string::npos ? Run{std::stoi(run), 0}
                                          : Run{std::stoi(run.substr(0, plus)), std::stoi(run.substr(plus + 1))};
  if (batch < 1 || r.new_tokens < 1 || r.prefix < 0) throw CLI::ValidationError("--shapes", s);
  return std::vector<Run>(size_t(batch), r);
}

double prefill_flops(const std::vector<Run>& runs, int32_t q_heads, int32_t head_dim, int32_t window) {
  double attended = 0;
  for (const Run& r : runs)
    for (int64_t j = 0; j < r.new_tokens; ++j) {
      const int64_t a = r.prefix + j + 1;
      attended += double(window > 0 ? std::min<int64_t>(a, window) : a);
    }
  return 4.0 * head_dim * q_heads * attended;
}

// The command line.
struct Flags {
  std::string formats = "bf16,fp8,nvfp4", shapes = "1024,4096,8192,16384,2048+30720,ragged8", heads = "32/8";
  std::string prefill = "automatic", stage_kv = "automatic", json_path, l2 = "cold";
  int head_dim = 128, block_size = 16, window = 0, splits = 0, tile_band = -1, tile_pairs = -1;
  double peak = 989.4;
  bool check_kernels = false;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--formats", f.formats, "comma list of bf16, fp8, nvfp4");
  app.add_option("--shapes", f.shapes, "comma list of N, N+P, BxN+P, ragged8");
  app.add_option("--heads", f.heads, "QHEADS/KVHEADS");
  app.add_option("--head-dim", f.head_dim)->check(CLI::IsMember({64, 128, 256}));
  app.add_option("--block-size", f.block_size)->check(CLI::IsMember({16, 32, 64, 128}));
  app.add_option("--window", f.window, "sliding window (0 = off)");
  app.add_option("--prefill", f.prefill, "automatic | off | on (AttnPlanOptions::prefill)")
      ->check(CLI::IsMember({"automatic", "off", "on"}));
  app.add_option("--splits", f.splits, "split count (0 = the planner's; AttnPlanOptions::num_splits)")
      ->check(CLI::Range(0, int(kMaxSplits)));
  app.add_option("--tile-band", f.tile_band,
                 "the prefill kernel's launch order with --prefill on (-1 = the planner's, 0 = the 3-D grid, n = "
                 "bands of n row tiles; AttnPlanOptions::tile_band)")
      ->check(CLI::Range(-1, 1 << 20));
  app.add_option("--tile-pairs", f.tile_pairs,
                 "the prefill kernel's CTA pairs with --prefill on (-1 = the planner's, 0 = off, 1 = on; "
                 "AttnPlanOptions::tile_pairs)")
      ->check(CLI::Range(-1, 1));
  app.add_option("--stage-kv", f.stage_kv,
                 "FP8 / NVFP4 with --prefill on: automatic | off (dequantised in the kernel's producer) | on (staged "
                 "as bf16 pages in the workspace first)")
      ->check(CLI::IsMember({"automatic", "off", "on"}));
  app.add_option("--peak-tflops", f.peak, "dense BF16 tensor-core peak the fractions are of (H100/H200 SXM: 989.4)");
  app.add_option("--json", f.json_path, "write rows as JSON");
  app.add_option("--l2", f.l2,
                 "cold: every call reads a cache replica the calls before evicted from L2 (64 MB rotated); "
                 "warm: every call reads the same cache, as the peers' timing does")
      ->check(CLI::IsMember({"cold", "warm"}));
  app.add_flag("--check", f.check_kernels,
               "also run the other kernel (runs <-> prefill) and compare per (row, head): rel. L2 <= 2e-2, no NaN");
}

// What every shape's row shares: the flags, heads, plan knobs and target.
struct Bench {
  Flags f;
  int qh = 32, kvh = 8;
  AttnPlanOptions options;
  detail::TuningOptions tuning;
  AttnTarget target;
};

// A shape's runs as the workload's sequences (each run at the end of its
// sequence) and q_start.
struct Batch {
  std::vector<Run> runs;
  bench::DecodeShape s;
  int32_t max_run = 1, nrows = 0;
  std::vector<int32_t> q_start{0};
};

Batch make_batch(const Bench& b, const std::string& format_name, const std::string& shape) {
  Batch batch;
  batch.runs = parse_shape(shape);
  bench::DecodeShape& s = batch.s;
  s.format = kv_format_from_string(format_name);
  s.num_seqs = int32_t(batch.runs.size());
  s.num_q_heads = b.qh;
  s.num_kv_heads = b.kvh;
  s.head_dim = b.f.head_dim;
  s.block_size = b.f.block_size;
  s.sliding_window = b.f.window;
  s.seq_len = 0;
  for (const Run& r : batch.runs) {
    s.lengths.push_back(r.new_tokens + r.prefix);
    s.seq_len = std::max(s.seq_len, r.new_tokens + r.prefix);
    batch.max_run = std::max(batch.max_run, r.new_tokens);
    batch.nrows += r.new_tokens;
    batch.q_start.push_back(batch.nrows);
  }
  return batch;
}

// --check: the other kernel (runs kernel with the planner's splits, or the
// prefill kernel forced) on replica 0 of `args` beside `plan`'s; the worst
// rel. L2 per (row, head) of their `n`-element outputs, and its line.
template <class Args>
std::pair<double, std::string> check_other_kernel(const Bench& b, const AttnPlan& plan, const Args& args,
                                                  const AttnProblem& problem, bf16* out, float* ws, size_t n) {
  detail::TuningOptions other;
  other.prefill = plan.kernel == AttnKernel::prefill ? detail::Toggle::off : detail::Toggle::on;
  const AttnPlan alt = detail::plan_attention(problem, b.target, {}, other);
  std::vector<bf16> x(n), y(n);
  cuda::run_attention(plan, args(0), SplitKWorkspace{ws, plan.workspace_bytes, plan.num_splits});
  cuda_ok(cudaMemcpy(x.data(), out, n * sizeof(bf16), cudaMemcpyDeviceToHost), "download out");
  float* ws2 = nullptr;
  cuda_ok(cudaMalloc(&ws2, std::max<size_t>(alt.workspace_bytes, 16)), "cudaMalloc(workspace)");
  cuda::run_attention(alt, args(0), SplitKWorkspace{ws2, alt.workspace_bytes, alt.num_splits});
  cuda_ok(cudaMemcpy(y.data(), out, n * sizeof(bf16), cudaMemcpyDeviceToHost), "download out");
  cudaFree(ws2);
  const double err = bench::max_rel_l2(x.data(), y.data(), n, b.f.head_dim);
  return {err, " | vs " + std::string(alt.kernel == AttnKernel::prefill ? "prefill" : "runs kernel") +
                   ": max rel L2 " + std::to_string(err) + (err <= 2e-2 ? " ok" : " FAIL")};
}

// The plan's kernel, splits and launch choices, as the rows name them.
std::string describe(const AttnPlan& plan) {
  const bool prefill_kernel = plan.kernel == AttnKernel::prefill;
  return std::string(prefill_kernel ? "prefill " : "runs ") + std::to_string(plan.num_splits) + " splits" +
         (prefill_kernel && plan.launch.tile_band > 0 ? ", band " + std::to_string(plan.launch.tile_band) : "") +
         (plan.launch.tile_pairs ? ", pairs" : "") + (plan.launch.stage_kv ? ", staged" : "");
}

// Times shape `shape` of format `format_name` (and checks it against the
// other kernel with --check); prints its line and returns its JSON row.
nlohmann::json shape_row(const Bench& b, const std::string& format_name, const std::string& shape) {
  const Flags& f = b.f;
  const Batch batch = make_batch(b, format_name, shape);
  // --l2 cold: replicas of the cache, 64 MB in all, read in turn, so
  // that each call finds its pages out of L2 (as a layer's attention
  // finds the cache the model's other layers evicted); warm: one.
  bench::DecodeWorkload w(batch.s, f.l2 == "cold" ? size_t(64) << 20 : 0, 1234);
  bf16 *q = nullptr, *out = nullptr;
  int32_t* q_start = nullptr;
  const size_t row_elems = size_t(b.qh) * f.head_dim, n = size_t(batch.nrows) * row_elems;
  cuda_ok(cudaMalloc(&q, n * sizeof(bf16)), "cudaMalloc(q)");
  // Random q: a constant one would make every row's softmax uniform.
  bench::random_bf16(q, int64_t(n), int32_t(row_elems), 4321);
  cuda_ok(cudaMalloc(&out, n * sizeof(bf16)), "cudaMalloc(out)");
  cuda_ok(cudaMalloc(&q_start, batch.q_start.size() * sizeof(int32_t)), "cudaMalloc(q_start)");
  cuda_ok(cudaMemcpy(q_start, batch.q_start.data(), batch.q_start.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
          "q_start");
  auto args = [&](int replica) { return w.runs_args(replica, out, q, int64_t(row_elems), q_start, batch.nrows); };
  const AttnProblem problem = attention_problem(args(0), w.max_seq_len(), batch.max_run);
  const AttnPlan plan = detail::plan_attention(problem, b.target, b.options, b.tuning);
  float* ws = nullptr;
  cuda_ok(cudaMalloc(&ws, std::max<size_t>(plan.workspace_bytes, 16)), "cudaMalloc(workspace)");
  const int per_graph = std::max(2, w.replicas());
  const double us = bench::median_us_per_call(
      [&](int call, cudaStream_t st) {
        cuda::run_attention(plan, args(call % w.replicas()), SplitKWorkspace{ws, plan.workspace_bytes, plan.num_splits},
                            st);
      },
      per_graph);
  const double tflops = prefill_flops(batch.runs, b.qh, f.head_dim, f.window) / (us * 1e6);
  const double gbps = w.attended_bytes() / (us * 1e3);  // the attended cache read once
  const std::string kernel = describe(plan);
  std::string check;
  double check_err = -1;
  if (f.check_kernels) std::tie(check_err, check) = check_other_kernel(b, plan, args, problem, out, ws, n);
  std::printf("%-6s %-12s %10.1f us %7.1f TFLOPS %6.3f P %7.0f GB/s  %s%s\n", format_name.c_str(), shape.c_str(), us,
              tflops, tflops / f.peak, gbps, kernel.c_str(), check.c_str());
  std::fflush(stdout);
  cudaFree(q);
  cudaFree(out);
  cudaFree(q_start);
  cudaFree(ws);
  return {{"format", format_name}, {"shape", shape},      {"us", us},
          {"tflops", tflops},      {"fraction_of_peak", tflops / f.peak},
          {"gbps", gbps},          {"kernel", kernel},    {"head_dim", f.head_dim},
          {"heads", f.heads},      {"check_max_rel_l2", check_err}, {"l2", f.l2}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"metrale prefill benchmark: query runs over the paged cache"};
  Bench b;
  add_flags(app, b.f);
  CLI11_PARSE(app, argc, argv);
  if (!cuda::available()) {
    std::fprintf(stderr, "prefill_bench: no sm_90 GPU here; nothing to measure\n");
    return 2;
  }
  const Flags& f = b.f;
  if (std::sscanf(f.heads.c_str(), "%d/%d", &b.qh, &b.kvh) != 2) throw CLI::ValidationError("--heads", f.heads);
  const cuda::DeviceInfo dev = cuda::device_info();
  std::printf("# %s, %d SMs; dense BF16 peak P = %.1f TFLOPS (stated); %d/%d heads d%d page %d; L2 %s\n",
              dev.name.c_str(), dev.num_sms, f.peak, b.qh, b.kvh, f.head_dim, f.block_size, f.l2.c_str());
  b.options.num_splits = f.splits;
  b.tuning.prefill = detail::toggle_from_string(f.prefill, "prefill");
  b.tuning.tile_band = f.tile_band;
  b.tuning.tile_pairs = f.tile_pairs;
  b.tuning.stage_kv = detail::toggle_from_string(f.stage_kv, "stage_kv");
  b.target = cuda::attention_target();
  nlohmann::json rows = nlohmann::json::array();
  bool failed = false;
  for (const std::string& fs : bench::split_list(f.formats))
    for (const std::string& sh : bench::split_list(f.shapes)) {
      rows.push_back(shape_row(b, fs, sh));
      failed = failed || rows.back()["check_max_rel_l2"].get<double>() > 2e-2;
    }
  if (!f.json_path.empty()) {
    nlohmann::json j;
    j["device"] = dev.name;
    j["peak_tflops"] = f.peak;
    j["rows"] = rows;
    std::ofstream(f.json_path) << j.dump(1) << "\n";
  }
  return failed ? 1 : 0;
}
