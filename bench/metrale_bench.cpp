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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"metrale benchmark: paged decode and cache write on the GPU"};
  std::string mode = "perf", op = "decode", formats = "bf16,fp8,nvfp4";
  std::string shapes = "1x1024,1x32768,16x8192,64x4096,128x2048,256x1024,32x32768";
  std::string heads = "32/8", csv_path, json_path, nvfp4_scales = "max6";
  std::string pairing = "automatic", load_path = "automatic", merge = "automatic";
  int head_dim = 128, block_size = 16, forced_splits = 0, window = 0, q_len = 1, col_tiles = 0, head_dim_parts = 0;
  bool mixed = false;
  app.add_option("--mode", mode, "perf | oracle | check")->check(CLI::IsMember({"perf", "oracle", "check"}));
  app.add_option("--op", op, "decode | write")->check(CLI::IsMember({"decode", "write"}));
  app.add_option("--formats", formats, "comma list of bf16, fp8, nvfp4");
  app.add_option("--shapes", shapes, "comma list of BATCHxCONTEXT");
  app.add_option("--heads", heads, "QHEADS/KVHEADS");
  app.add_option("--head-dim", head_dim)->check(CLI::IsMember({64, 128, 256}));
  app.add_option("--block-size", block_size)->check(CLI::IsMember({16, 32, 64, 128}));
  // Plan options (AttnPlanOptions): A/B runs force one decision at a time.
  app.add_option("--splits", forced_splits, "force num_splits (0 = planner)");
  app.add_option("--pairing", pairing, "automatic | off | on (kv-head pairs at head_dim 64)")
      ->check(CLI::IsMember({"automatic", "off", "on"}));
  app.add_option("--load-path", load_path, "automatic | registers | tma")
      ->check(CLI::IsMember({"automatic", "registers", "tma"}));
  app.add_option("--merge", merge, "automatic | single_pass | cluster | workspace")
      ->check(CLI::IsMember({"automatic", "single_pass", "cluster", "workspace"}));
  app.add_option("--window", window, "sliding window (0 = off)");
  app.add_flag("--mixed", mixed, "lengths uniform in [1, CONTEXT]");
  app.add_option("--q-len", q_len, "query rows per sequence (> 1: query runs through run_attention, docs/spec.md 8)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--col-tiles", col_tiles, "runs kernel: n-tiles of 8 columns per CTA (0 = planner, 1, 2)")
      ->check(CLI::Range(0, 2));
  app.add_option("--head-dim-parts", head_dim_parts,
                 "runs kernel: 0 = planner, 1, 2 = head_dim split over teams of two warps (NVFP4)")
      ->check(CLI::Range(0, 2));
  app.add_option("--nvfp4-scales", nvfp4_scales,
                 "--op write: comma list of NVFP4 group-scale rules (max6, adaptive; docs/nvfp4_scales.md), one "
                 "row each and their time ratio; decode does not depend on the rule");
  app.add_option("--csv", csv_path, "write rows as CSV");
  app.add_option("--json", json_path, "write rows as JSON");
  CLI11_PARSE(app, argc, argv);
  std::vector<Nvfp4ScaleRule> rules;
  for (const std::string& r : split_list(nvfp4_scales)) {
    try {
      rules.push_back(nvfp4_scale_rule_from_string(r));
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
  const double ceiling = metrale::bench::measure_read_ceiling_gbps();
  const double empty_us = metrale::bench::empty_launch_us();
  std::printf("# %s, %d SMs; read ceiling R = %.0f GB/s (16-byte loads, 1 GiB windows, graph replay); "
              "empty kernel %.2f us per launch\n",
              dev.name.c_str(), dev.num_sms, ceiling, empty_us);

  AttnPlanOptions options;
  options.num_splits = forced_splits;
  options.merge = split_merge_from_string(merge);  // the names CLI11 checked above
  detail::TuningOptions tuning;
  tuning.pairing = detail::toggle_from_string(pairing, "pairing");
  tuning.load_path = detail::load_path_from_string(load_path);
  // The runs kernel's tiling applies to the q_len > 1 plan only (the q_len 1
  // decode plan beside it keeps the decode kernel's).
  detail::TuningOptions runs_tuning = tuning;
  runs_tuning.col_tiles = col_tiles;
  runs_tuning.head_dim_parts = head_dim_parts;
  const AttnTarget target = cuda::attention_target();
  int qh = 32, kvh = 8;
  if (std::sscanf(heads.c_str(), "%d/%d", &qh, &kvh) != 2) throw CLI::ValidationError("--heads", heads);
  std::vector<Row> rows;
  for (const std::string& fs : split_list(formats)) {
    for (const std::string& sh : split_list(shapes)) {
      DecodeShape s;
      try {
        s.format = kv_format_from_string(fs);
      } catch (const InvalidArgument& e) {
        throw CLI::ValidationError("--formats", e.what());
      }
      if (std::sscanf(sh.c_str(), "%dx%d", &s.num_seqs, &s.seq_len) != 2) throw CLI::ValidationError("--shapes", sh);
      s.num_q_heads = qh;
      s.num_kv_heads = kvh;
      s.head_dim = head_dim;
      s.block_size = block_size;
      s.sliding_window = window;
      s.mixed_lengths = mixed;
      const size_t first_row = rows.size();  // this shape's rows are printed below
      DecodeWorkload w(s, kRotationBytes, 1234 + rows.size());
      const AttnProblem prob = attention_problem(w.args(0, nullptr), w.max_seq_len());
      const AttnPlan plan = detail::plan_attention(prob, target, options, tuning);
      // The planner's own choice of splits with the forced options otherwise (oracle mode).
      auto plan_with_splits = [&](int32_t ns) {
        AttnPlanOptions o = options;
        o.num_splits = ns;
        return detail::plan_attention(prob, target, o, tuning);
      };
      const size_t max_ws = splitk_workspace_bytes(s.num_seqs, qh, head_dim, kMaxSplits);
      bf16* out = nullptr;
      float* ws = nullptr;
      cuda_ok(cudaMalloc(&out, size_t(s.num_seqs) * qh * head_dim * sizeof(bf16)), "cudaMalloc(out)");
      cuda_ok(cudaMalloc(&ws, max_ws), "cudaMalloc(workspace)");

      auto row_for = [&](int32_t ns, double us) {
        Row r;
        r.op = op;
        r.shape = s.name();
        r.splits = ns;
        r.us = us;
        r.gbps = w.attended_bytes() / (us * 1e3);
        r.frac = r.gbps / ceiling;
        return r;
      };
      if (op == "write") {
        // Cache write of one new token per sequence x 64 steps' worth of
        // tokens. Each of the graph's kSets calls takes its own input set and
        // slot mapping, so (as in the decode rows) a call's bf16 rows come
        // from HBM, not from L2 where the previous call left them.
        constexpr int kSets = 10;
        const int64_t tokens = std::max<int64_t>(int64_t(s.num_seqs) * 64, 4096);
        const int32_t row_len = kvh * head_dim;
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
        const AttnArgs a = w.args(0, out);
        const int64_t cap = a.cache.layout.capacity_slots();
        std::vector<int64_t> hs(size_t(kSets) * tokens);
        for (int64_t t = 0; t < kSets * tokens; ++t) hs[size_t(t)] = (t * 7919) % cap;
        cuda_ok(cudaMemcpy(slots, hs.data(), hs.size() * 8, cudaMemcpyHostToDevice), "slots");
        CacheWriteArgs wa;
        wa.key_stride = wa.value_stride = row_len;
        wa.num_tokens = tokens;
        wa.cache = a.cache;
        double max6_us = 0.0;
        // An NVFP4 row per group-scale rule (the rule is the layout's); the others once.
        const std::vector<Nvfp4ScaleRule> write_rules =
            s.format == KvFormat::nvfp4 ? rules : std::vector<Nvfp4ScaleRule>{Nvfp4ScaleRule::max6};
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
          Row r = row_for(0, us);
          const double bytes = double(tokens) * (2.0 * row_len * 2 + a.cache.layout.kv_bytes_per_token()) + tokens * 8;
          r.shape = std::string(fs) + (s.format == KvFormat::nvfp4 ? std::string(" ") + to_string(rule) : "") +
                    " write " + std::to_string(tokens) + " tokens " + heads + " d" + std::to_string(head_dim);
          r.gbps = bytes / (us * 1e3);
          r.frac = r.gbps / ceiling;
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
      } else if (mode == "perf" && q_len > 1) {
        // q_len query rows per sequence at the end of its cache (speculative
        // verification), through run_attention; q rows and outputs of their own.
        const int32_t nrows = s.num_seqs * q_len;
        std::vector<int32_t> qs(size_t(s.num_seqs) + 1);
        for (int32_t i = 0; i <= s.num_seqs; ++i) qs[size_t(i)] = i * q_len;
        bf16 *q = nullptr, *rout = nullptr;
        int32_t* q_start = nullptr;
        cuda_ok(cudaMalloc(&q, size_t(nrows) * qh * head_dim * sizeof(bf16)), "cudaMalloc(q)");
        cuda_ok(cudaMemset(q, 0x3c, size_t(nrows) * qh * head_dim * sizeof(bf16)), "memset(q)");
        cuda_ok(cudaMalloc(&rout, size_t(nrows) * qh * head_dim * sizeof(bf16)), "cudaMalloc(out)");
        cuda_ok(cudaMalloc(&q_start, qs.size() * sizeof(int32_t)), "cudaMalloc(q_start)");
        cuda_ok(cudaMemcpy(q_start, qs.data(), qs.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "q_start");
        auto runs_args = [&](int replica) {
          return w.runs_args(replica, rout, q, int64_t(qh) * head_dim, q_start, nrows);
        };
        const AttnPlan rplan = detail::plan_attention(attention_problem(runs_args(0), w.max_seq_len(), q_len), target, options,
                                                     runs_tuning);
        float* rws = nullptr;
        cuda_ok(cudaMalloc(&rws, std::max<size_t>(rplan.workspace_bytes, 16)), "cudaMalloc(workspace)");
        const int per_graph = std::max(w.replicas(), std::min(20, 4 * w.replicas()));
        const double us = metrale::bench::median_us_per_call(
            [&](int call, cudaStream_t st) {
              cuda::run_attention(rplan, runs_args(call % w.replicas()),
                             SplitKWorkspace{rws, rplan.workspace_bytes, rplan.num_splits}, st);
            },
            per_graph);
        rows.push_back(row_for(rplan.num_splits, us));
        rows.back().shape += " q" + std::to_string(q_len);
        rows.back().plan = describe(rplan) + " tiles " + std::to_string(rplan.launch.head_tiles) + "x" +
                           std::to_string(8 * rplan.launch.col_tiles) +
                           (rplan.launch.head_dim_parts == 2 ? " halves" : "");
        cudaFree(q);
        cudaFree(rout);
        cudaFree(q_start);
        cudaFree(rws);
      } else if (mode == "perf") {
        rows.push_back(row_for(plan.num_splits, time_decode(w, plan, out, ws, max_ws)));
        rows.back().plan = describe(plan);
      } else if (mode == "oracle") {
        double best_us = 1e30;
        int32_t best = 1;
        for (int32_t ns : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}) {
          if (ns > (w.max_seq_len() + block_size - 1) / block_size && ns > 1) break;
          const double us = time_decode(w, plan_with_splits(ns), out, ws, max_ws);
          if (us < best_us) best_us = us, best = ns;
        }
        const AttnPlan planned = plan_with_splits(0);
        Row r = row_for(planned.num_splits, time_decode(w, planned, out, ws, max_ws));
        r.plan = describe(planned);
        char note[96];
        std::snprintf(note, sizeof note, "best: %d splits %.1f us (planner %+.1f%%)", best, best_us,
                      100.0 * (r.us / best_us - 1));
        r.note = note;
        rows.push_back(r);
      } else {  // check
        const int32_t ns = plan.num_splits;
        cuda::run_attention(plan, w.args(0, out), SplitKWorkspace{ws, max_ws, ns});
        std::vector<bf16> gpu(size_t(s.num_seqs) * qh * head_dim), ref(gpu.size());
        cuda_ok(cudaMemcpy(gpu.data(), out, gpu.size() * 2, cudaMemcpyDeviceToHost), "download out");
        DecodeWorkload::HostCopy h = w.download_replica0();
        AttnArgs a = w.args(0, ref.data());
        a.q = h.q.data();
        a.cache.k = h.k.data();
        a.cache.v = h.v.data();
        a.block_tables = h.block_tables.data();
        a.seq_lens = h.seq_lens.data();
        test::cpu_single_pass(a);
        Row r = row_for(ns, 0);
        r.plan = describe(plan);
        r.us = r.gbps = r.frac = 0;
        r.err = metrale::bench::max_rel_l2(gpu.data(), ref.data(), gpu.size(), head_dim);
        r.note = r.err <= 1e-2 ? "ok" : "FAIL";
        rows.push_back(r);
      }
      cudaFree(out);
      cudaFree(ws);
      for (size_t i = first_row; i < rows.size(); ++i) {
        const Row& r = rows[i];
        std::printf("%-34s splits %3d  %9.1f us  %7.0f GB/s  %5.3f R  %-28s %s\n", r.shape.c_str(), r.splits, r.us,
                    r.gbps, r.frac, r.plan.c_str(),
                    r.err >= 0 ? (std::to_string(r.err) + " " + r.note).c_str() : r.note.c_str());
      }
      std::fflush(stdout);
    }
  }

  if (!csv_path.empty()) {
    std::ofstream f(csv_path);
    f << "op,shape,splits,us,gbps,fraction_of_ceiling,ceiling_gbps,max_rel_err,note,empty_launch_us,plan\n";
    for (const Row& r : rows)
      f << r.op << ",\"" << r.shape << "\"," << r.splits << "," << r.us << "," << r.gbps << "," << r.frac << ","
        << ceiling << "," << r.err << ",\"" << r.note << "\"," << empty_us << ",\"" << r.plan << "\"\n";
  }
  if (!json_path.empty()) {
    nlohmann::json j;
    j["device"] = dev.name;
    j["ceiling_gbps"] = ceiling;
    j["empty_launch_us"] = empty_us;
    for (const Row& r : rows)
      j["rows"].push_back({{"op", r.op}, {"shape", r.shape}, {"splits", r.splits}, {"us", r.us}, {"gbps", r.gbps},
                           {"fraction_of_ceiling", r.frac}, {"max_rel_err", r.err}, {"note", r.note},
                           {"plan", r.plan}});
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  bool failed = false;
  for (const Row& r : rows) failed |= r.note == "FAIL";
  return failed ? 1 : 0;
}
