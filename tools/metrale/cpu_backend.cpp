// The demo on the CPU reference backend (see backends.hpp).
#include <algorithm>
#include <chrono>

#include "backends.hpp"
#include "kv_setup.hpp"
#include "metrale/cpu.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {
namespace {

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

FormatResult run_format(KvFormat format, const HostBatch& b, const std::vector<double>& ref, int reps) {
  FormatResult r;
  r.format = format;
  const KvCacheLayout layout = make_layout(format, b.shape, b.num_blocks);
  r.kv_bytes_per_token = layout.kv_bytes_per_token();

  // Calibrate (one batch: the rows themselves) and write the cache.
  float k_absmax = 0.0f, v_absmax = 0.0f;
  cpu::bf16_absmax(b.key.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &k_absmax);
  cpu::bf16_absmax(b.value.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &v_absmax);
  AlignedVector<uint8_t> k_cache(size_t(layout.cache_bytes())), v_cache(size_t(layout.cache_bytes()));
  KvCacheView cache{layout, k_cache.data(), v_cache.data(), scales_from_absmax(format, k_absmax, v_absmax)};

  CacheWriteArgs w;
  w.key = b.key.data();
  w.key_stride = b.kv_row();
  w.value = b.value.data();
  w.value_stride = b.kv_row();
  w.slot_mapping = b.slot_mapping.data();
  w.num_tokens = b.num_tokens();
  w.cache = cache;
  cpu::reshape_and_cache(w);

  // Decode with the planner's choice for this machine.
  DecodeProblem problem;
  problem.num_seqs = b.num_seqs();
  problem.num_q_heads = b.shape.num_q_heads;
  problem.layout = layout;
  problem.max_seq_len = b.max_seq_len();
  const DecodePlan plan = plan_decode(problem, cpu::num_threads());
  r.accuracy_splits = r.timed_splits = plan.num_splits;
  AlignedVector<float> ws(plan.workspace_bytes / sizeof(float) + 1);
  const SplitKWorkspace workspace{ws.data(), plan.workspace_bytes, plan.num_splits};
  AlignedVector<bf16> out(size_t(b.out_elems()));

  DecodeArgs a;
  a.q = b.q.data();
  a.q_stride = b.q_row();
  a.num_seqs = b.num_seqs();
  a.num_q_heads = b.shape.num_q_heads;
  a.cache = cache;
  a.block_tables = b.block_tables.data();
  a.max_blocks_per_seq = b.max_blocks_per_seq;
  a.seq_lens = b.seq_lens.data();
  a.sm_scale = b.sm_scale;
  a.out = out.data();

  cpu::run_decode(plan, a, workspace);  // warm-up; its output is the one checked
  r.error = compare_to_reference(out.data(), ref, b.num_seqs(), b.shape.num_q_heads, b.shape.head_dim);
  r.kernel_error = compare_to_reference(out.data(), attention_f64(b, cache_rows(b, cache)), b.num_seqs(),
                                        b.shape.num_q_heads, b.shape.head_dim);
  std::vector<double> us;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::run_decode(plan, a, workspace);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  r.time_us = median(us);
  double tokens = 0;
  for (int32_t len : b.seq_lens) tokens += len;
  r.attended_bytes = tokens * r.kv_bytes_per_token;
  return r;
}

}  // namespace

std::vector<FormatResult> run_cpu(const HostBatch& batch, const std::vector<double>& ref, int reps) {
  std::vector<FormatResult> rows;
  for (KvFormat f : kAllFormats) rows.push_back(run_format(f, batch, ref, reps));
  return rows;
}

}  // namespace metrale::cli
