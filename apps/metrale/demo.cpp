// The default job (see demo.hpp), one loop for both backends.
#include "demo.hpp"

#include <chrono>

#include "backend.hpp"
#include "metrale/cpu.hpp"
#include "table.hpp"

namespace metrale::cli {
namespace {

// r.error against `ref` (float64 over the original rows) and r.kernel_error
// against float64 over the cache `d` wrote, for one decode of `b`.
void score(FormatResult& r, const HostBatch& b, const std::vector<double>& ref, const BatchDecode& d,
           const KvScales& scales) {
  const KvCacheView cache{make_layout(r.format, b.shape, b.num_blocks), const_cast<uint8_t*>(d.k_cache.data()),
                          const_cast<uint8_t*>(d.v_cache.data()), scales};
  const int32_t S = b.num_seqs(), hq = b.shape.num_q_heads, dim = b.shape.head_dim;
  r.error = test::compare_decode(d.out.data(), ref, S, hq, dim);
  const AttnArgs host = b.decode_args(b.q.data(), cache, b.block_tables.data(), b.seq_lens.data(), nullptr);
  r.kernel_error = test::compare_decode(d.out.data(), test::reference_attention(host), S, hq, dim);
}

}  // namespace

DemoReport run_demo(const DemoOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  DemoReport rep;
  if (opt.cpu_threads > 0) cpu::set_num_threads(opt.cpu_threads);

  const std::unique_ptr<Backend> be = make_backend(opt.force_cpu, &rep.cpu_reason);
  const bool gpu = rep.cpu_reason.empty();
  const HostBatch batch = make_batch(rep.shape, opt.seqs, opt.max_len, opt.seed);
  rep.accuracy_lens = batch.seq_lens;
  const KvCacheView shape_only{make_layout(KvFormat::bf16, batch.shape, batch.num_blocks), nullptr, nullptr, {}};
  const std::vector<double> ref = test::attention_f64(
      batch.decode_args(batch.q.data(), shape_only, batch.block_tables.data(), batch.seq_lens.data(), nullptr),
      bf16_rows(batch));
  TimedBatch timed;
  timed.num_seqs = opt.gpu_seqs;
  timed.seq_len = opt.gpu_len;
  timed.reps = opt.reps;
  timed.seed = opt.seed;

  rep.backend = be->name();
  rep.device = gpu ? format("%s, %d SMs", be->device().c_str(), be->attention_target().num_sms) : be->device();
  rep.ceiling_gbps = be->read_ceiling_gbps();
  rep.timed_batch = gpu ? format("%d seqs x %d tokens", timed.num_seqs, timed.seq_len) : "the accuracy batch";
  for (KvFormat f : all_formats()) {
    FormatResult r;
    r.format = f;
    r.kv_bytes_per_token = make_layout(f, batch.shape, 1).kv_bytes_per_token();
    const KvScales scales = calibrated_scales(batch, f);
    const BatchDecode d = decode_batch(*be, batch, f, scales);
    score(r, batch, ref, d, scales);
    r.accuracy_splits = d.num_splits;
    const DecodeTiming t = be->time_decode(batch, f, scales, timed);
    r.timed_splits = t.num_splits;
    r.time_us = t.time_us;
    r.attended_bytes = t.attended_bytes;
    if (rep.ceiling_gbps > 0) {
      r.gbps = r.attended_bytes / (r.time_us * 1e3);
      r.ceiling_fraction = r.gbps / rep.ceiling_gbps;
    }
    rep.rows.push_back(r);
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace metrale::cli
