// The accuracy comparison (see accuracy.hpp).
#include "accuracy.hpp"

#include <cmath>

#include "backend.hpp"
#include "metrale/cpu.hpp"

namespace metrale::cli {
namespace {

struct Absmax {
  float k = 0.0f, v = 0.0f;
};

Absmax absmax_of(const HostBatch& b) {
  Absmax a;
  cpu::bf16_absmax(b.key.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &a.k);
  cpu::bf16_absmax(b.value.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &a.v);
  return a;
}

// Values of `b` past the absmax a calibration saw (they saturate in the cache).
int64_t count_clipped(const HostBatch& b, const Absmax& calib) {
  int64_t n = 0;
  for (size_t i = 0; i < b.key.size(); ++i) {
    n += std::fabs(codec::bf16_to_float(b.key[i])) > calib.k;
    n += std::fabs(codec::bf16_to_float(b.value[i])) > calib.v;
  }
  return n;
}

}  // namespace

AccuracyReport run_accuracy(const AccuracyOptions& opt, Backend& be) {
  AccuracyReport rep;
  HostBatch batch = make_batch(opt.shape, opt.seqs, opt.max_len, opt.seed);
  fill_realistic(batch, opt.model, opt.seed);
  HostBatch calib = make_batch(opt.shape, opt.seqs, opt.max_len, opt.seed + 1);
  fill_realistic(calib, opt.model, opt.seed + 1);  // same model, other tokens
  rep.seq_lens = batch.seq_lens;
  const Absmax own = absmax_of(batch), sep = absmax_of(calib);
  rep.k_absmax = own.k;
  rep.v_absmax = own.v;
  rep.calib_k_absmax = sep.k;
  rep.calib_v_absmax = sep.v;
  const KvCacheView shape_only{make_layout(KvFormat::bf16, batch.shape, batch.num_blocks), nullptr, nullptr, {}};
  const std::vector<double> ref = test::attention_f64(
      batch.decode_args(batch.q.data(), shape_only, batch.block_tables.data(), batch.seq_lens.data(), nullptr),
      bf16_rows(batch));

  struct Variant {
    KvFormat format;
    const char* calibration;
    const Absmax* absmax;  // nullptr: default scales (bf16; nvfp4 g = 1)
  };
  const Variant variants[] = {{KvFormat::bf16, "-", nullptr},
                              {KvFormat::fp8_e4m3, "same batch", &own},
                              {KvFormat::fp8_e4m3, "separate batch", &sep},
                              {KvFormat::nvfp4, "none (g = 1)", nullptr},
                              {KvFormat::nvfp4, "same batch", &own},
                              {KvFormat::nvfp4, "separate batch", &sep}};
  for (const Variant& v : variants) {
    AccuracyRow row;
    row.format = v.format;
    row.calibration = v.calibration;
    if (v.absmax) {
      row.scales = kv_scales_from_absmax(v.format, v.absmax->k, v.absmax->v);
      row.clipped = count_clipped(batch, *v.absmax);
    }
    row.kv_bytes_per_token = make_layout(v.format, batch.shape, 1).kv_bytes_per_token();
    const BatchDecode d = decode_batch(be, batch, v.format, row.scales);
    row.num_splits = d.num_splits;
    row.error =
        test::compare_decode(d.out.data(), ref, batch.num_seqs(), batch.shape.num_q_heads, batch.shape.head_dim);
    rep.rows.push_back(row);
  }
  return rep;
}

}  // namespace metrale::cli
