// The format table's lookups (metrale/format.hpp) and the format names.
#include <algorithm>

#include "metrale/format.hpp"

#include "metrale/error.hpp"

namespace metrale {

std::string kv_format_names() {
  std::string s;
  for (int i = 0; i < kNumKvFormats; ++i)
    s += std::string(i == 0 ? "" : i + 1 == kNumKvFormats ? " or " : ", ") + kKvFormats[i].name;
  return s;
}

std::string kv_format_enumerators() {
  std::string s;
  for (int i = 0; i < kNumKvFormats; ++i)
    s += std::string(i == 0 ? "" : ", ") + kKvFormats[i].enum_name + " (" + std::to_string(i) + ")";
  return s;
}

const KvFormatDesc& kv_format_desc(KvFormat f) {
  if (int(f) >= kNumKvFormats) detail::throw_unsupported("format", int(f), kv_format_enumerators());
  return kKvFormats[int(f)];
}

const char* to_string(KvFormat f) { return int(f) < kNumKvFormats ? kKvFormats[int(f)].name : "unknown"; }

KvFormat kv_format_from_string(const std::string& name) {
  for (const KvFormatDesc& d : kKvFormats)
    if (name == d.name) return d.format;
  detail::throw_invalid("format", name, kv_format_names());
}

namespace {
float scale_from_absmax(const KvFormatDesc& d, float absmax) {
  return absmax > 0.0f ? std::max(absmax / d.calibration_max, d.min_tensor_scale) : 1.0f;
}
}  // namespace

KvScales kv_scales_from_absmax(KvFormat f, float k_absmax, float v_absmax) {
  const KvFormatDesc& d = kv_format_desc(f);
  KvScales s;
  if (d.tensor_scale == KvTensorScale::scale) {
    s.k_scale = scale_from_absmax(d, k_absmax);
    s.v_scale = scale_from_absmax(d, v_absmax);
  } else if (d.tensor_scale == KvTensorScale::global_scale) {
    s.k_global_scale = scale_from_absmax(d, k_absmax);
    s.v_global_scale = scale_from_absmax(d, v_absmax);
  }
  return s;
}

float fp8_scale_from_absmax(float absmax) { return scale_from_absmax(kKvFormats[int(KvFormat::fp8_e4m3)], absmax); }
float nvfp4_global_scale_from_absmax(float absmax) {
  return scale_from_absmax(kKvFormats[int(KvFormat::nvfp4)], absmax);
}

}  // namespace metrale
