// The split planner and the debug block-table validator.
//
// Decision rule (one function; both backends and the benchmark's oracle mode
// call it): a decode launch has one CTA per (sequence, kv head, 8-q-head
// tile, split). Single pass when the batch alone gives every SM enough CTAs;
// otherwise cut each sequence into as many splits as fill one resident wave,
// but never splits shorter than kMinTokensPerSplit.
#include <algorithm>
#include <string>

#include "kernels/decode/decode_params.hpp"
#include "metrale/error.hpp"
#include "metrale/plan.hpp"

namespace metrale {
namespace {
// Splitting past one resident wave (kernels::kDecodeCtasPerSm CTAs per SM)
// only adds tails and reduce work (measured with `metrale_bench --mode
// oracle`, bench/RESULTS.md).
// Two 16-token steps per warp of a 4-warp CTA: below this a
// split's prologue, epilogue and record cost more than its parallelism gains.
constexpr int32_t kMinTokensPerSplit = 128;
}  // namespace

size_t splitk_workspace_bytes(int32_t num_seqs, int32_t num_q_heads, int32_t head_dim, int32_t num_splits) {
  return size_t(num_seqs) * size_t(num_q_heads) * size_t(num_splits) * size_t(head_dim + 2) * sizeof(float);
}

DecodePlan plan_decode(const DecodeProblem& p, int32_t num_sms) {
  p.layout.validate();
  METRALE_CHECK_ARG(p.num_seqs >= 0, "num_seqs", p.num_seqs, ">= 0");
  METRALE_CHECK_ARG(p.num_q_heads > 0 && p.num_q_heads % p.layout.num_kv_heads == 0, "num_q_heads", p.num_q_heads,
                    "a positive multiple of num_kv_heads = " + std::to_string(p.layout.num_kv_heads));
  METRALE_CHECK_ARG(p.max_seq_len >= 0, "max_seq_len", p.max_seq_len, ">= 0");
  METRALE_CHECK_ARG(p.sliding_window >= 0, "sliding_window", p.sliding_window, ">= 0");
  METRALE_CHECK_ARG(num_sms > 0, "num_sms", num_sms, "> 0");

  // CTAs per split: one per (sequence, kv head or head pair, 8-q-head tile).
  int32_t group = p.num_q_heads / p.layout.num_kv_heads, kv_units = p.layout.num_kv_heads;
  if (kernels::decode_pairs_kv_heads(p.layout.head_dim, kv_units, group, p.num_seqs, num_sms)) {
    kv_units /= 2;
    group *= 2;
  }
  const int64_t head_tiles = (group + kernels::kDecodeQHeadsPerCta - 1) / kernels::kDecodeQHeadsPerCta;
  const int64_t base_ctas = int64_t(p.num_seqs) * kv_units * head_tiles;
  const int64_t attended =
      p.sliding_window > 0 ? std::min<int64_t>(p.max_seq_len, p.sliding_window + p.layout.block_size) : p.max_seq_len;

  DecodePlan plan;
  const int64_t target = int64_t(num_sms) * kernels::kDecodeCtasPerSm;
  if (base_ctas > 0 && base_ctas < target) {
    const int64_t by_fill = target / base_ctas;  // stay within one resident wave
    const int64_t by_length = std::max<int64_t>(1, attended / kMinTokensPerSplit);
    plan.num_splits = int32_t(std::clamp<int64_t>(std::min(by_fill, by_length), 1, kMaxSplits));
  }
  if (plan.num_splits > 1)
    plan.workspace_bytes = splitk_workspace_bytes(p.num_seqs, p.num_q_heads, p.layout.head_dim, plan.num_splits);
  return plan;
}

void validate_block_tables(const KvCacheLayout& layout, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t sliding_window) {
  layout.validate();
  METRALE_CHECK_ARG(max_blocks_per_seq > 0, "max_blocks_per_seq", max_blocks_per_seq, "> 0");
  if (num_seqs <= 0) return;
  METRALE_CHECK_ARG(block_tables != nullptr, "block_tables", "nullptr", "a host pointer");
  METRALE_CHECK_ARG(seq_lens != nullptr, "seq_lens", "nullptr", "a host pointer");
  const int64_t max_len = int64_t(max_blocks_per_seq) * layout.block_size;
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t len = seq_lens[s];
    if (len < 0 || len > max_len)
      detail::throw_invalid("seq_lens", "seq_lens[" + std::to_string(s) + "] = " + std::to_string(len),
                            "0..max_blocks_per_seq*block_size = " + std::to_string(max_len));
    const PageRange r = attended_pages(len, sliding_window, layout.block_size);
    for (int32_t pg = r.first; pg < r.end; ++pg) {
      const int32_t id = block_tables[int64_t(s) * max_blocks_per_seq + pg];
      if (id < 0 || id >= layout.num_blocks)
        detail::throw_invalid("block_tables",
                              "block_tables[" + std::to_string(s) + "][" + std::to_string(pg) + "] = " +
                                  std::to_string(id),
                              "a page id in 0.." + std::to_string(layout.num_blocks - 1));
    }
  }
}

}  // namespace metrale
