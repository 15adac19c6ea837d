// Argument validation shared by the CPU and CUDA backends (docs/spec.md 6).
#include "host/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "metrale/error.hpp"
#include "metrale/format.hpp"

namespace metrale::detail {
namespace {

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_ptr(const void* p, const char* name, bool need_align16) {
  METRALE_CHECK_ARG(p != nullptr, name, "nullptr", "a valid pointer");
  if (need_align16) METRALE_CHECK_ARG(aligned16(p), name, p, "a 16-byte aligned pointer");
}

void check_scale(float s, float min, const char* name) {
  METRALE_CHECK_ARG(std::isfinite(s) && s >= min, name, s,
                    concat("a finite f32 >= ", min, " (the format's min_tensor_scale: the writes' reciprocals finite)"));
}

// The token and head strides of the cache write's key or value, or of the
// query rows: multiples of 8 elements (16-byte aligned rows for the vector
// loads), and the T x H rows of D elements distinct, nested either way
// (token-major: heads inside a token; head-major: tokens inside a head).
// Overlapping rows would read without fault but are a caller's mistake (a
// stride of 0, a stride that counts bytes), so they are refused.
void check_row_strides(const char* name, int64_t token_stride, const char* head_name, int64_t head_stride_arg,
                       int64_t T, int64_t H, int64_t D, const char* tokens = "num_tokens",
                       const char* heads = "num_kv_heads") {
  const std::string token_name = std::string(name) + "_stride";
  METRALE_CHECK_ARG(head_stride_arg >= 0 && head_stride_arg % 8 == 0, head_name, head_stride_arg,
                    "a multiple of 8 elements >= 0 (0 = head_dim)");
  METRALE_CHECK_ARG(token_stride >= 0 && token_stride % 8 == 0, token_name.c_str(), token_stride,
                    "a multiple of 8 elements >= 0");
  const int64_t hs = head_stride_arg ? head_stride_arg : D;
  // A stride along an extent of one (one row, one head) or of no rows at all
  // is never followed: any multiple of 8 will do.
  if (T == 0) return;
  const bool token_major = (H <= 1 || hs >= D) && (T <= 1 || token_stride >= (H - 1) * hs + D);
  const bool head_major = (T <= 1 || token_stride >= D) && (H <= 1 || hs >= (T - 1) * token_stride + D);
  if (token_major || head_major) return;
  if (head_stride_arg == 0 || hs == D)  // packed heads: the rule of a plain row stride
    throw_invalid(token_name.c_str(), token_stride,
                  concat(">= ", heads, "*head_dim = ", H * D, " (rows of packed heads) and a multiple of 8 elements"));
  throw_invalid(token_name.c_str(), concat(token_stride, " with ", head_name, " = ", hs),
                concat("rows of head_dim = ", D, " that do not overlap: token-major (", head_name, " >= ", D,
                       " and ", token_name, " >= (", heads, "-1)*", head_name, " + head_dim = ", (H - 1) * hs + D,
                       ") or head-major (", token_name, " >= ", D, " and ", head_name,
                       " >= (", tokens, "-1)*", token_name, " + head_dim = ", (T - 1) * token_stride + D, ")"));
}

}  // namespace

void validate_cache_view(const KvCacheView& cache) {
  cache.layout.validate();
  check_ptr(cache.k, "cache.k", true);
  check_ptr(cache.v, "cache.v", true);
  const KvFormatDesc& f = kv_format_desc(cache.layout.format);
  if (f.tensor_scale != KvTensorScale::none) {
    check_scale(f.k_scale(cache.scales), f.min_tensor_scale, f.k_scale_name());
    check_scale(f.v_scale(cache.scales), f.min_tensor_scale, f.v_scale_name());
  }
}

void validate_cache_write(const CacheWriteArgs& a) {
  METRALE_CHECK_ARG(a.num_tokens >= 0 && a.num_tokens <= (int64_t(1) << 31) - 1, "num_tokens", a.num_tokens,
                    "0..2^31-1");
  validate_cache_view(a.cache);
  if (a.num_tokens == 0) return;
  check_ptr(a.key, "key", true);
  check_ptr(a.value, "value", true);
  check_ptr(a.slot_mapping, "slot_mapping", false);
  const int64_t H = a.cache.layout.num_kv_heads, D = a.cache.layout.head_dim;
  check_row_strides("key", a.key_stride, "key_head_stride", a.key_head_stride, a.num_tokens, H, D);
  check_row_strides("value", a.value_stride, "value_head_stride", a.value_head_stride, a.num_tokens, H, D);
  if (a.saturated)
    METRALE_CHECK_ARG((reinterpret_cast<uintptr_t>(a.saturated) & 7u) == 0, "saturated",
                      static_cast<const void*>(a.saturated), "an 8-byte aligned int64[2]");
}

void validate_attn(const AttnArgs& a, bool writes_out) {
  METRALE_CHECK_ARG(a.num_seqs >= 0, "num_seqs", a.num_seqs, ">= 0");
  METRALE_CHECK_ARG(a.q_start != nullptr || a.num_q_rows == 0 || a.num_q_rows == a.num_seqs, "num_q_rows",
                    a.num_q_rows,
                    "0 or num_seqs = " + std::to_string(a.num_seqs) + " without q_start (one row per sequence)");
  METRALE_CHECK_ARG(a.num_q_rows >= 0, "num_q_rows", a.num_q_rows, ">= 0");
  validate_cache_view(a.cache);
  const int32_t hkv = a.cache.layout.num_kv_heads, d = a.cache.layout.head_dim;
  METRALE_CHECK_ARG(a.num_q_heads > 0 && a.num_q_heads % hkv == 0, "num_q_heads", a.num_q_heads,
                    "a positive multiple of num_kv_heads = " + std::to_string(hkv));
  METRALE_CHECK_ARG(a.sliding_window >= 0, "sliding_window", a.sliding_window, ">= 0 (0 = off)");
  METRALE_CHECK_ARG(std::isfinite(a.sm_scale), "sm_scale", a.sm_scale, "a finite f32");
  METRALE_CHECK_ARG(std::isfinite(a.softcap) && a.softcap >= 0.0f, "softcap", a.softcap,
                    "a finite f32 >= 0 (0 = off)");
  METRALE_CHECK_ARG(a.max_blocks_per_seq > 0, "max_blocks_per_seq", a.max_blocks_per_seq, "> 0");
  if (a.num_seqs == 0) return;
  if (a.rows() > 0) {  // runs may all be empty
    check_ptr(a.q, "q", true);
    if (writes_out) check_ptr(a.out, "out", true);
  }
  check_ptr(a.block_tables, "block_tables", false);
  check_ptr(a.seq_lens, "seq_lens", false);
  check_row_strides("q", a.q_stride, "q_head_stride", a.q_head_stride, a.rows(), a.num_q_heads, d,
                    "num_q_rows", "num_q_heads");
}


void validate_query_runs(const AttnArgs& a) {
  if (a.sinks)
    for (int32_t h = 0; h < a.num_q_heads; ++h)
      if (std::isnan(a.sinks[h])) throw_invalid("sinks", "sinks[" + std::to_string(h) + "] = NaN", "a logit or -inf");
  if (a.q_start == nullptr || a.num_seqs == 0) return;
  METRALE_CHECK_ARG(a.q_start[0] == 0, "q_start", "q_start[0] = " + std::to_string(a.q_start[0]), "0");
  for (int32_t i = 0; i < a.num_seqs; ++i) {
    const int32_t n = a.q_start[i + 1] - a.q_start[i];
    if (n < 0)
      throw_invalid("q_start", "q_start[" + std::to_string(i + 1) + "] = " + std::to_string(a.q_start[i + 1]),
                    "non-decreasing (>= q_start[" + std::to_string(i) + "] = " + std::to_string(a.q_start[i]) + ")");
    if (n > a.seq_lens[i])
      throw_invalid("q_start", "a run of " + std::to_string(n) + " rows for sequence " + std::to_string(i),
                    "at most seq_lens[" + std::to_string(i) + "] = " + std::to_string(a.seq_lens[i]) + " rows");
  }
  METRALE_CHECK_ARG(a.q_start[a.num_seqs] == a.num_q_rows, "q_start",
                    "q_start[num_seqs] = " + std::to_string(a.q_start[a.num_seqs]),
                    "num_q_rows = " + std::to_string(a.num_q_rows));
}

void validate_kv_view(const AttnArgs& a) {
  if ((a.kv_start == nullptr) != (a.kv_lens == nullptr))
    throw_invalid(a.kv_start ? "kv_lens" : "kv_start", "nullptr", "given with kv_start and kv_lens both (a shard view)");
  if (a.kv_start == nullptr) return;
  const int32_t B = a.cache.layout.block_size;
  const int64_t capacity = int64_t(a.max_blocks_per_seq) * B;
  for (int32_t i = 0; i < a.num_seqs; ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (a.kv_start[i] < 0 || a.kv_start[i] % B != 0)
      throw_invalid("kv_start", "kv_start" + at + " = " + std::to_string(a.kv_start[i]),
                    "a non-negative multiple of block_size = " + std::to_string(B));
    if (a.kv_lens[i] < 0 || a.kv_lens[i] > capacity || int64_t(a.kv_start[i]) + a.kv_lens[i] > a.seq_lens[i])
      throw_invalid("kv_lens", "kv_lens" + at + " = " + std::to_string(a.kv_lens[i]),
                    "0..min(max_blocks_per_seq*block_size = " + std::to_string(capacity) + ", seq_lens" + at +
                        " - kv_start" + at + ")");
  }
}

void validate_workspace(const AttnArgs& a, const SplitKWorkspace& ws) {
  METRALE_CHECK_ARG(ws.num_splits >= 1 && ws.num_splits <= kMaxSplits, "num_splits", ws.num_splits,
                    "1.." + std::to_string(kMaxSplits));
  if (a.num_seqs == 0) return;
  check_ptr(ws.data, "workspace", true);
  const size_t need = splitk_workspace_bytes(a.rows(), a.num_q_heads, a.cache.layout.head_dim, ws.num_splits);
  METRALE_CHECK_ARG(ws.bytes >= need, "workspace_bytes", ws.bytes, ">= " + std::to_string(need));
}

void validate_reduce(const ReduceArgs& a) {
  METRALE_CHECK_ARG(a.num_seqs >= 0, "num_seqs", a.num_seqs, ">= 0");
  METRALE_CHECK_ARG(a.num_q_heads > 0, "num_q_heads", a.num_q_heads, "> 0");
  bool hd_ok = false;
  for (int hd : kSupportedHeadDims) hd_ok |= (hd == a.head_dim);
  if (!hd_ok) throw_unsupported("head_dim", a.head_dim, "64, 128, 256");
  METRALE_CHECK_ARG(a.num_splits >= 1 && a.num_splits <= kMaxSplits, "num_splits", a.num_splits,
                    "1.." + std::to_string(kMaxSplits));
  if (a.num_seqs == 0) return;
  check_ptr(a.workspace, "workspace", true);
  check_ptr(a.out, "out", true);
  const size_t need = splitk_workspace_bytes(a.num_seqs, a.num_q_heads, a.head_dim, a.num_splits);
  METRALE_CHECK_ARG(a.workspace_bytes >= need, "workspace_bytes", a.workspace_bytes, ">= " + std::to_string(need));
}

void validate_run(const AttnPlan& plan, const AttnArgs& a, const SplitKWorkspace& ws) {
  validate_attn(a, plan.merge != SplitMerge::states_only);
  METRALE_CHECK_ARG(plan.num_splits >= 1 && plan.num_splits <= kMaxSplits, "plan.num_splits", plan.num_splits,
                    "1.." + std::to_string(kMaxSplits));
  const KvCacheLayout &P = plan.problem.layout, &L = a.cache.layout;
  if (P.format != L.format || P.block_size != L.block_size || P.num_kv_heads != L.num_kv_heads ||
      P.head_dim != L.head_dim)
    throw_invalid("plan", std::string("a plan for ") + to_string(P.format) + " block_size " +
                              std::to_string(P.block_size) + ", " + std::to_string(P.num_kv_heads) +
                              " kv heads, head_dim " + std::to_string(P.head_dim),
                  std::string("a plan for the cache's ") + to_string(L.format) + " block_size " +
                      std::to_string(L.block_size) + ", " + std::to_string(L.num_kv_heads) + " kv heads, head_dim " +
                      std::to_string(L.head_dim));
  METRALE_CHECK_ARG(plan.problem.num_q_heads == a.num_q_heads, "num_q_heads", a.num_q_heads,
                    "the plan's num_q_heads = " + std::to_string(plan.problem.num_q_heads));
  METRALE_CHECK_ARG(a.num_seqs <= plan.problem.num_seqs, "num_seqs", a.num_seqs,
                    "<= the plan's num_seqs = " + std::to_string(plan.problem.num_seqs));
  const int64_t plan_rows = plan.problem.rows();
  METRALE_CHECK_ARG(a.rows() <= plan_rows, "num_q_rows", a.rows(),
                    "<= the plan's query rows = " + std::to_string(plan_rows));
  if (a.num_seqs == 0) return;
  if (plan.launch.stage_kv) {  // the staged pages follow the records (plan/prefill_staging.hpp)
    check_ptr(ws.data, "workspace", true);
    METRALE_CHECK_ARG(ws.bytes >= plan.workspace_bytes, "workspace_bytes", ws.bytes,
                      ">= the plan's workspace_bytes = " + std::to_string(plan.workspace_bytes) +
                          " (split-K records and staged bf16 pages)");
  }
  if (plan.merge == SplitMerge::single_pass || plan.merge == SplitMerge::cluster) return;
  check_ptr(ws.data, "workspace", true);
  const size_t need = splitk_workspace_bytes(a.rows(), a.num_q_heads, L.head_dim, plan.num_splits);
  METRALE_CHECK_ARG(ws.bytes >= need, "workspace_bytes", ws.bytes, ">= " + std::to_string(need));
  METRALE_CHECK_ARG(ws.num_splits == plan.num_splits, "workspace.num_splits", ws.num_splits,
                    "the plan's num_splits = " + std::to_string(plan.num_splits));
}

void validate_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, const float* absmax) {
  METRALE_CHECK_ARG(num_rows >= 0, "num_rows", num_rows, ">= 0");
  METRALE_CHECK_ARG(row_len >= 0, "row_len", row_len, ">= 0");
  METRALE_CHECK_ARG(row_stride >= row_len, "row_stride", row_stride, ">= row_len = " + std::to_string(row_len));
  check_ptr(absmax, "absmax", false);
  if (num_rows > 0 && row_len > 0) check_ptr(x, "x", false);
}

}  // namespace metrale::detail
