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

// Values of `b` the cache write saturates under `scales` (the library's one
// definition, codec::fp8_saturates / nvfp4_saturates, which the write counts by).
int64_t count_clipped(const HostBatch& b, KvFormat f, const KvScales& scales) {
  int64_t n = 0;
  const auto count = [&](const AlignedVector<bf16>& rows, float scale, float global_scale) {
    const float inv = 1.0f / scale, six_g = 6.0f * global_scale;  // the quantizers' f32 values
    for (const bf16 v : rows) {
      const float x = codec::bf16_to_float(v);
      if (f == KvFormat::fp8_e4m3) n += codec::fp8_saturates(x, inv);
      if (f == KvFormat::nvfp4) n += codec::nvfp4_saturates(x, six_g);
    }
  };
  count(b.key, scales.k_scale, scales.k_global_scale);
  count(b.value, scales.v_scale, scales.v_global_scale);
  return n;
}

// Relative RMS error of a written cache against the bf16 rows it holds:
// ||x~ - x||2 / ||x||2 over every element of every token (per-tensor scale
// applied), K and V apart.
void cache_errors(const HostBatch& b, const KvCacheLayout& l, const KvScales& sc, const BatchDecode& d,
                  AccuracyRow& row) {
  const KvFormatDesc& f = kv_format_desc(l.format);
  const int64_t H = l.num_kv_heads, D = l.head_dim;
  double num[2] = {0, 0}, den[2] = {0, 0};
  for (int64_t j = 0; j < b.num_tokens(); ++j) {
    const int64_t slot = b.slot_mapping[size_t(j)];
    const int64_t page = (slot / l.block_size) * l.page_stride_bytes;
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* base = (kv ? d.v_cache.data() : d.k_cache.data()) + page;
      const bf16* src = (kv ? b.value.data() : b.key.data()) + j * b.kv_row();
      const float tensor = kv ? f.v_scale(sc) : f.k_scale(sc);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t r = (slot % l.block_size) * H + h;
        for (int32_t e = 0; e < D; ++e) {
          const double x = codec::bf16_to_float(src[h * D + e]);
          const double q = f.element(base + f.code_offset(l, r), base + f.scale_offset(l, r), e, tensor);
          num[kv] += (q - x) * (q - x);
          den[kv] += x * x;
        }
      }
    }
  }
  row.k_rel_rms = den[0] > 0 ? std::sqrt(num[0] / den[0]) : 0.0;
  row.v_rel_rms = den[1] > 0 ? std::sqrt(num[1] / den[1]) : 0.0;
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
    Nvfp4ScaleRule rule;
    const char* calibration;
    const Absmax* absmax;    // nullptr: default scales (bf16; nvfp4 g = 1)
    bool wide_g;             // g = absmax / (448 * 4) (the larger g that lets every group map its absmax to
                             // 4 unclamped; measured beside the calibration both rules take)
  };
  using R = Nvfp4ScaleRule;
  const Variant variants[] = {{KvFormat::bf16, R::max6, "-", nullptr, false},
                              {KvFormat::fp8_e4m3, R::max6, "same batch", &own, false},
                              {KvFormat::fp8_e4m3, R::max6, "separate batch", &sep, false},
                              {KvFormat::nvfp4, R::max6, "none (g = 1)", nullptr, false},
                              {KvFormat::nvfp4, R::max6, "same batch", &own, false},
                              {KvFormat::nvfp4, R::max6, "separate batch", &sep, false},
                              {KvFormat::nvfp4, R::adaptive, "none (g = 1)", nullptr, false},
                              {KvFormat::nvfp4, R::adaptive, "same batch", &own, false},
                              {KvFormat::nvfp4, R::adaptive, "separate batch", &sep, false},
                              {KvFormat::nvfp4, R::adaptive, "separate batch, g = amax/1792", &sep, true}};
  for (const Variant& v : variants) {
    AccuracyRow row;
    row.format = v.format;
    row.nvfp4_scales = v.rule;
    row.calibration = v.calibration;
    KvCacheLayout layout = make_layout(v.format, batch.shape, batch.num_blocks);
    if (v.rule != layout.nvfp4_scales) layout = layout.with_nvfp4_scales(v.rule);
    if (v.absmax) row.scales = kv_scales_from_absmax(v.format, v.absmax->k, v.absmax->v);
    if (v.wide_g) {
      row.scales.k_global_scale = v.absmax->k / (codec::kE4M3Max * 4.0f);
      row.scales.v_global_scale = v.absmax->v / (codec::kE4M3Max * 4.0f);
    }
    row.clipped = count_clipped(batch, v.format, row.scales);
    row.kv_bytes_per_token = layout.kv_bytes_per_token();
    const BatchDecode d = decode_batch(be, batch, v.format, row.scales, 0, v.rule);
    cache_errors(batch, layout, row.scales, d, row);
    row.num_splits = d.num_splits;
    row.error =
        test::compare_decode(d.out.data(), ref, batch.num_seqs(), batch.shape.num_q_heads, batch.shape.head_dim);
    rep.rows.push_back(row);
  }
  return rep;
}

}  // namespace metrale::cli
