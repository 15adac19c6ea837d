// The demo on the CPU reference backend (see backends.hpp).
#include <algorithm>

#include "backends.hpp"
#include "kv_setup.hpp"
#include "metrale/cpu.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {

void score(FormatResult& r, const HostBatch& b, const std::vector<double>& ref, const BatchDecode& d,
           const KvScales& scales) {
  const KvCacheLayout layout = make_layout(r.format, b.shape, b.num_blocks);
  const KvCacheView cache{layout, const_cast<uint8_t*>(d.k_cache.data()), const_cast<uint8_t*>(d.v_cache.data()),
                          scales};
  const int32_t hq = b.shape.num_q_heads, dim = b.shape.head_dim;
  r.error = compare_to_reference(d.out.data(), ref, b.num_seqs(), hq, dim);
  r.kernel_error = compare_to_reference(d.out.data(), attention_f64(b, cache_rows(b, cache)), b.num_seqs(), hq, dim);
}

std::vector<FormatResult> run_cpu(const HostBatch& batch, const std::vector<double>& ref, int reps) {
  double tokens = 0;
  for (int32_t len : batch.seq_lens) tokens += len;
  std::vector<FormatResult> rows;
  for (KvFormat f : kAllFormats) {
    FormatResult r;
    r.format = f;
    r.kv_bytes_per_token = make_layout(f, batch.shape, 1).kv_bytes_per_token();
    const KvScales scales = calibrated_scales(batch, f);
    // One warm-up decode (the output scored), then the median of `reps`.
    const BatchDecode d = decode_batch_cpu(batch, f, scales, 0, std::max(reps, 1));
    score(r, batch, ref, d, scales);
    r.accuracy_splits = r.timed_splits = d.num_splits;
    r.time_us = d.median_us;
    r.attended_bytes = tokens * r.kv_bytes_per_token;
    rows.push_back(r);
  }
  return rows;
}

}  // namespace metrale::cli
