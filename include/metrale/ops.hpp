// Arguments of every operation of docs/spec.md section 1, shared by the CPU
// reference backend (metrale/cpu.hpp) and the CUDA backend (metrale/cuda.hpp).
//
// Pointers are to host memory for the CPU backend and device memory for the
// CUDA backend. Element strides count elements, not bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"

namespace metrale {

// reshape_and_cache: head h of token j's K row is the head_dim contiguous
// values at key[j*key_stride + h*key_head_stride] (V alike); it is written
// to slot slot_mapping[j] of the cache. Rows of a fused QKV projection have
// key_head_stride = head_dim (0 says the same) and key_stride the projection's
// width; a head-major view, e.g. transformers' (B, Hkv, S, D) cache tensor
// sliced at one position, key[:, :, s], has key_stride = Hkv*S*D and
// key_head_stride = S*D; one sequence's S new tokens of it, key[b] read as
// (S, Hkv, D), have key_stride = D and key_head_stride = S*D. Strides are
// validated so that the num_tokens x num_kv_heads rows of head_dim elements
// are distinct: token-major (head stride >= D, token stride >= (H-1)*head
// stride + D) or head-major (token stride >= D, head stride >=
// (num_tokens-1)*token stride + D).
// A negative slot is padding and skipped; a slot >= capacity is skipped and
// counted in *skipped. Elements past the calibrated range of the cache's
// scales, clipped to the format's largest value (codec::fp8_saturates /
// nvfp4_saturates: |x| / scale, or |x| / (6 g), past 464, the rounding
// interval of E4M3's largest code 448; BF16 never saturates), are counted in
// saturated[0] (K) and saturated[1] (V), over the written tokens only.
struct CacheWriteArgs {
  const bf16* key = nullptr;             // 16-byte aligned; head h of token j at key + j*key_stride + h*key_head_stride
  int64_t key_stride = 0;                // elements between tokens, a multiple of 8
  int64_t key_head_stride = 0;           // elements between heads, a multiple of 8; 0 = head_dim (packed heads)
  const bf16* value = nullptr;           // 16-byte aligned, as key
  int64_t value_stride = 0;              // elements, a multiple of 8
  int64_t value_head_stride = 0;         // elements, a multiple of 8; 0 = head_dim
  const int64_t* slot_mapping = nullptr; // [num_tokens]
  int64_t num_tokens = 0;
  KvCacheView cache;                     // scales: fp8 k/v_scale, nvfp4 k/v_global_scale
  int32_t* skipped = nullptr;            // optional counter, incremented per out-of-capacity slot
  int64_t* saturated = nullptr;          // optional [2], 8-byte aligned: += saturated K elements, V elements

  // The head strides in force (head_dim where 0).
  int64_t key_head_stride_used() const { return key_head_stride ? key_head_stride : cache.layout.head_dim; }
  int64_t value_head_stride_used() const { return value_head_stride ? value_head_stride : cache.layout.head_dim; }
};

// Attention over the paged cache (docs/spec.md 8), every query shape through
// one struct: decode (q_start null: one row per sequence), speculative
// verification, a chunk of a chunked prefill, a prompt. Sequence i's query
// run is rows q_start[i] .. q_start[i+1] of q (n_i rows, n_i <= seq_lens[i];
// their K/V already written into the cache, seq_lens counting them); row j
// sits at position p = L_i - n_i + j and attends to positions
// [max(0, p + 1 - W), p] (causal, aligned to the end of the cache, window W
// per query). q head h reads kv head h / (num_q_heads / num_kv_heads).
struct AttnArgs {
  // Head h of query row r at q + r*q_stride + h*q_head_stride, head_dim
  // contiguous values: rows of a fused QKV projection (q_head_stride =
  // head_dim), or any (rows, heads, head_dim) view with a unit inner stride,
  // e.g. transformers' (1, heads, tokens, head_dim) query read as (tokens,
  // heads, head_dim): q_stride = head_dim, q_head_stride = tokens*head_dim.
  // The rows x heads rows of head_dim must not overlap (token-major or
  // head-major nesting, as the cache write's K/V).
  const bf16* q = nullptr;               // 16-byte aligned
  int64_t q_stride = 0;                  // elements between rows, a multiple of 8
  int64_t q_head_stride = 0;             // elements between heads, a multiple of 8; 0 = head_dim (packed heads)
  const int32_t* q_start = nullptr;      // [num_seqs + 1], non-decreasing, q_start[0] = 0, q_start[num_seqs] = num_q_rows;
                                         // null: one row per sequence (decode)
  int32_t num_seqs = 0;
  int32_t num_q_rows = 0;                // rows of q, out and lse; with q_start null, 0 or num_seqs
  int32_t num_q_heads = 0;
  KvCacheView cache;
  const int32_t* block_tables = nullptr; // [num_seqs, max_blocks_per_seq] page ids
  int32_t max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;     // [num_seqs], n_i <= L <= max_blocks_per_seq * block_size
  int32_t sliding_window = 0;            // 0 = off
  float sm_scale = 0.0f;                 // multiplies the logits (1/sqrt(D) usually)
  // Optional: one f32 sink logit per q head, joining the softmax
  // denominator only, at the final normalisation (-inf: none; NaN rejected).
  const float* sinks = nullptr;          // [num_q_heads]
  float softcap = 0.0f;                  // c > 0: each logit s becomes c * tanh(s / c); 0 = off
  bf16* out = nullptr;                   // [rows, num_q_heads, D], contiguous
  float* lse = nullptr;                  // optional [rows, num_q_heads]: m + ln(l) of the attended
                                         // positions (without the sink), -inf where none
  // Optional, both or neither: a shard view of each sequence's context
  // (context-parallel query runs, docs/context_parallel.md 7). Sequence i's
  // block-table row then lists the pages of global positions [kv_start[i],
  // kv_start[i] + kv_lens[i]) from entry 0 (kv_start[i] a multiple of
  // block_size); seq_lens[i] stays the global length (the causal rule is
  // unchanged) and each row attends what of its range lies in the view.
  // CPU backend only for now: the CUDA backend throws Unsupported.
  const int32_t* kv_start = nullptr;     // [num_seqs]
  const int32_t* kv_lens = nullptr;      // [num_seqs], kv_start[i] + kv_lens[i] <= seq_lens[i]

  // The query rows: num_q_rows with runs, num_seqs without.
  int32_t rows() const { return q_start ? num_q_rows : num_seqs; }
  // The head stride in force (head_dim where 0).
  int64_t q_head_stride_used() const { return q_head_stride ? q_head_stride : cache.layout.head_dim; }
  // Whether sinks, soft-cap or lse are asked for (the runs kernel serves them).
  bool has_options() const { return sinks != nullptr || softcap > 0.0f || lse != nullptr; }
};

// Query row j of a run of n rows over a sequence of length L: its position
// and the positions it attends, [begin, end).
struct QueryRange {
  int32_t begin, end;
};
METRALE_HD QueryRange query_range(int32_t seq_len, int32_t run_len, int32_t j, int32_t sliding_window) {
  const int32_t end = seq_len - run_len + j + 1;
  const int32_t begin = sliding_window > 0 && end > sliding_window ? end - sliding_window : 0;
  return QueryRange{begin, end};
}
// A row's range inside a shard view of positions [view_start, view_start +
// view_len), in the view's own positions (0 = view_start); {0, 0} if empty.
// The span of a whole run is view_range of [first row's begin, last row's
// end): every row's range lies inside it (ranges grow with the row), though
// a window can leave rows at its ends nothing.
METRALE_HD QueryRange view_range(QueryRange r, int32_t view_start, int32_t view_len) {
  const int32_t b = r.begin > view_start ? r.begin - view_start : 0;
  const int32_t e = r.end - view_start < view_len ? r.end - view_start : view_len;
  return e > b ? QueryRange{b, e} : QueryRange{0, 0};
}

// Split-K state (docs/spec.md 4): f32 records of D + 2 floats, record index
// (seq*num_q_heads + h)*num_splits + split: the split's normalised partial
// output, then m (max logit) and l (sum of exp(logit - m)). Layout, merge,
// empty and NaN rules: metrale/softmax_state.hpp.
struct SplitKWorkspace {
  float* data = nullptr;
  size_t bytes = 0;
  int32_t num_splits = 1;
};

size_t splitk_workspace_bytes(int64_t num_rows, int32_t num_q_heads, int32_t head_dim, int32_t num_splits);

// Split s of a sequence covers pages [first + s*per, min(first + (s+1)*per, end))
// of its attended range, per = ceil((end - first) / num_splits): contiguous,
// page-aligned, the same rule on every backend.
struct PageRange {
  int32_t first, end;  // pages [first, end) of the sequence's block-table row
};
METRALE_HD PageRange split_pages(PageRange attended, int32_t split, int32_t num_splits) {
  const int32_t per = (attended.end - attended.first + num_splits - 1) / num_splits;
  const int32_t a = attended.first + split * per;
  const int32_t b = a + per;
  return PageRange{a < attended.end ? a : attended.end, b < attended.end ? b : attended.end};
}

// First attended position of a sequence of length L under window W.
METRALE_HD int32_t window_start(int32_t seq_len, int32_t sliding_window) {
  return (sliding_window > 0 && seq_len > sliding_window) ? seq_len - sliding_window : 0;
}
METRALE_HD PageRange attended_pages(int32_t seq_len, int32_t sliding_window, int32_t block_size) {
  return PageRange{window_start(seq_len, sliding_window) / block_size, (seq_len + block_size - 1) / block_size};
}

struct ReduceArgs {
  const float* workspace = nullptr;
  size_t workspace_bytes = 0;
  int32_t num_seqs = 0;                  // rows: the query rows of AttnArgs (sequences of a decode)
  int32_t num_q_heads = 0;
  int32_t head_dim = 0;
  int32_t num_splits = 0;
  bf16* out = nullptr;                   // [num_seqs, num_q_heads, head_dim]
  const float* sinks = nullptr;          // optional [num_q_heads], applied at the final normalisation
  float* lse = nullptr;                  // optional [num_seqs, num_q_heads]: M + ln(L) of the merged state
};

// The reduce that merges the split-K states `ws` of `args` into args.out (and args.lse).
inline ReduceArgs reduce_args_for(const AttnArgs& args, const SplitKWorkspace& ws) {
  ReduceArgs r;
  r.workspace = ws.data;
  r.workspace_bytes = ws.bytes;
  r.num_seqs = args.rows();
  r.num_q_heads = args.num_q_heads;
  r.head_dim = args.cache.layout.head_dim;
  r.num_splits = ws.num_splits;
  r.out = args.out;
  r.sinks = args.sinks;
  r.lse = args.lse;
  return r;
}

// Largest num_splits a split-K launch accepts.
constexpr int32_t kMaxSplits = 256;

}  // namespace metrale
