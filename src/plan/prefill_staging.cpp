// prefill_staging (prefill_staging.hpp).
#include "plan/prefill_staging.hpp"

#include <algorithm>

namespace metrale::geometry {

namespace {
size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

PrefillStaging prefill_staging(const AttnProblem& p) {
  const KvCacheLayout& L = p.layout;
  const int64_t bs = L.block_size;
  PrefillStaging s;
  s.table_stride = int32_t((int64_t(p.max_seq_len) + bs - 1) / bs);
  // A span [begin, seq_len) of n positions covers at most ceil(n / bs) + 1 pages.
  const int64_t span = p.sliding_window > 0 ? std::min<int64_t>(p.max_seq_len, int64_t(p.sliding_window) + p.max_q_len - 1)
                                            : p.max_seq_len;
  s.slots = int32_t(std::min<int64_t>(s.table_stride, (span + bs - 1) / bs + 1));
  s.page_bytes = bs * L.num_kv_heads * L.head_dim * 2;
  const size_t seqs = size_t(std::max(p.num_seqs, 0));
  const size_t pages = seqs * size_t(s.slots) * size_t(s.page_bytes);
  s.table_offset = 0;
  s.k_offset = align_up(seqs * size_t(s.table_stride) * sizeof(int32_t), kPrefillStageAlign);
  s.v_offset = s.k_offset + pages;
  s.bytes = s.v_offset + pages + kPrefillStageAlign;
  return s;
}

}  // namespace metrale::geometry
