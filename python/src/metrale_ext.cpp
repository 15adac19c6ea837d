// _metrale: the private nanobind extension under the `metrale` Python package.
//
// Thin on purpose: every function takes arrays as nb::ndarray (DLPack, the
// buffer protocol: torch, CuPy, JAX, NumPy), checks dtype / shape / strides /
// device and dispatches to metrale::cpu (host arrays) or metrale::cuda (CUDA
// arrays, on the stream handle passed in, never synchronising). The typed,
// documented API lives in python/metrale/__init__.py.
//
// This file: the module, its error translation, the layout and scale
// bindings, the cache write, absmax and __cuda_array_interface__ import.
// attention_ext.cpp: the plan, attention, reduce_states, the block-table
// check. block_allocator_ext.cpp: the page allocator. ext_common.hpp: the
// array checks they share.
//
// Errors: metrale::InvalidArgument (and Unsupported) -> ValueError,
// metrale::CudaError -> metrale.CudaError (a RuntimeError); argument checks
// done here raise ValueError / TypeError naming the argument.

#include "ext_common.hpp"

namespace metrale_ext {
void bind_attention(nb::module_& m);       // attention_ext.cpp
void bind_block_allocator(nb::module_& m); // block_allocator_ext.cpp

namespace {

int64_t reshape_and_cache(const In& key, const In& value, const In& slot_mapping, const KvCacheLayout& layout,
                          const Out& k_cache, const Out& v_cache, const ScalesTuple& scales,
                          std::optional<Out> skipped, std::optional<Out> saturated, uintptr_t stream) {
  layout.validate();
  DeviceCheck dc;
  dc.add(key, "key");
  dc.add(value, "value");
  dc.add(slot_mapping, "slot_mapping");
  dc.add(k_cache, "k_cache");
  dc.add(v_cache, "v_cache");
  if (skipped) dc.add(*skipped, "skipped");
  if (saturated) dc.add(*saturated, "saturated");
  KvInput kr = kv_input(key, "key", layout.num_kv_heads, layout.head_dim);
  KvInput vr = kv_input(value, "value", layout.num_kv_heads, layout.head_dim);
  if (vr.total() != kr.total())
    value_error("'value': ", vr.total(), " tokens, shape ", shape_str(value), "; expected ", kr.total(),
                " (as many as 'key', shape ", shape_str(key), ")");
  if (kr.groups != vr.groups) {  // one of them is evenly spaced: write both per group
    const int64_t B = kr.groups != 1 ? kr.groups : vr.groups, S = kr.groups != 1 ? kr.tokens : vr.tokens;
    regroup(kr, B, S);
    regroup(vr, B, S);
  }
  check_dtype(slot_mapping, "slot_mapping", nb::dlpack::dtype_code::Int, 64, "int64");
  if (slot_mapping.ndim() < 1 || slot_mapping.ndim() > 2 || nbytes(slot_mapping) != 8 * kr.total() ||
      !c_contiguous(slot_mapping))
    value_error("'slot_mapping': expected a contiguous int64 array of shape (", kr.total(),
                ",) (one slot per key token; (batch, seq) for a 4-D key), got shape ", shape_str(slot_mapping));
  int32_t* skipped_ptr = nullptr;
  if (skipped) {
    check_dtype(*skipped, "skipped", nb::dlpack::dtype_code::Int, 32, "int32");
    if (nbytes(*skipped) < 4) value_error("'skipped': expected an int32 array of at least 1 element");
    skipped_ptr = static_cast<int32_t*>(skipped->data());
  }
  int64_t* saturated_ptr = nullptr;
  if (saturated) {
    check_dtype(*saturated, "saturated", nb::dlpack::dtype_code::Int, 64, "int64");
    if (nbytes(*saturated) < 16 || !c_contiguous(*saturated))
      value_error("'saturated': expected a contiguous int64 array of at least 2 elements (K, V), got shape ",
                  shape_str(*saturated));
    saturated_ptr = static_cast<int64_t*>(saturated->data());
  }
  CacheWriteArgs a;
  a.key_stride = kr.token_stride;
  a.key_head_stride = kr.head_stride;
  a.value_stride = vr.token_stride;
  a.value_head_stride = vr.head_stride;
  a.num_tokens = kr.tokens;
  a.cache = make_view(layout, k_cache, v_cache, scales);
  a.skipped = skipped_ptr;
  a.saturated = saturated_ptr;
  if (kr.total() == 0) return 0;
  const int64_t* slots = static_cast<const int64_t*>(slot_mapping.data());
  // One write per group (one in all but the unevenly spaced 4-D case);
  // the counters accumulate over them.
  auto group = [&](int64_t b) {
    CacheWriteArgs g = a;
    g.key = kr.ptr + b * kr.group_stride;
    g.value = vr.ptr + b * vr.group_stride;
    g.slot_mapping = slots + b * kr.tokens;
    return g;
  };
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    int64_t n = 0;
    for (int64_t b = 0; b < kr.groups; ++b) n += cpu::reshape_and_cache(group(b));
    return n;
  }
  DeviceGuard g(dc.w);
  for (int64_t b = 0; b < kr.groups; ++b) cuda::reshape_and_cache(group(b), as_stream(stream));
  return -1;
}

void bf16_absmax(const In& x, const Out& absmax, uintptr_t stream, const std::string& name) {
  const char* xname = name.c_str();
  DeviceCheck dc;
  dc.add(x, xname);
  dc.add(absmax, "absmax");
  check_bf16(x, xname);
  check_dtype(absmax, "absmax", nb::dlpack::dtype_code::Float, 32, "float32");
  if (nbytes(absmax) < 4) value_error("'absmax': expected a float32 array of at least 1 element");
  // Rows: the last dimension contiguous, extended over the dimensions
  // contiguous with it; the others merge where their strides chain. Any
  // strided view (a transformers slice key[:, :, s], a permuted (S, H, D)
  // view) is then rows of one stride, or a few such sets (one call per index
  // of the dimensions left, the largest dimension being the rows): the
  // values are read where they lie, never copied.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (extent, stride) of extents > 1, outer to inner
  for (size_t i = 0; i < x.ndim(); ++i) {
    if (x.shape(i) == 0) return;  // no values
    if (x.shape(i) != 1) dims.emplace_back(x.shape(i), stride(x, i));
  }
  int64_t row_len = 1;
  if (!dims.empty()) {
    if (dims.back().second != 1)
      value_error("'", name, "': expected the last dimension of extent > 1 contiguous (stride 1), got shape ",
                  shape_str(x), " strides ", strides_str(x));
    while (!dims.empty() && dims.back().second == row_len) {
      row_len *= dims.back().first;
      dims.pop_back();
    }
  }
  std::vector<std::pair<int64_t, int64_t>> outer;  // merged, inner to outer
  for (size_t i = dims.size(); i-- > 0;) {
    if (!outer.empty() && dims[i].second == outer.back().first * outer.back().second)
      outer.back().first *= dims[i].first;
    else
      outer.push_back(dims[i]);
  }
  size_t rows_dim = 0;
  for (size_t i = 1; i < outer.size(); ++i)
    if (outer[i].first > outer[rows_dim].first) rows_dim = i;
  const int64_t num_rows = outer.empty() ? 1 : outer[rows_dim].first;
  const int64_t row_stride = outer.empty() ? row_len : outer[rows_dim].second;
  int64_t calls = 1;
  for (size_t i = 0; i < outer.size(); ++i)
    if (i != rows_dim) calls *= outer[i].first;
  const bf16* base = static_cast<const bf16*>(x.data());
  auto rows_at = [&](int64_t c) {  // call c's first row: the other dimensions' index c, inner first
    int64_t off = 0;
    for (size_t i = 0; i < outer.size(); ++i) {
      if (i == rows_dim) continue;
      off += (c % outer[i].first) * outer[i].second;
      c /= outer[i].first;
    }
    return base + off;
  };
  float* out = static_cast<float*>(absmax.data());
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    for (int64_t c = 0; c < calls; ++c) cpu::bf16_absmax(rows_at(c), num_rows, row_len, row_stride, out);
    return;
  }
  DeviceGuard g(dc.w);
  for (int64_t c = 0; c < calls; ++c) cuda::bf16_absmax(rows_at(c), num_rows, row_len, row_stride, out, as_stream(stream));
}

// An nb::ndarray over the memory an object describes with
// __cuda_array_interface__ (Numba, older CuPy, ...): nanobind reads DLPack and
// the buffer protocol only. Keeps `obj` alive; bf16 has no CAI typestr, so
// bf16 data comes as '<u2' (bit patterns) or through DLPack.
// CUDA device of a device pointer (0 for nullptr).
int pointer_device(uintptr_t ptr) {
  if (ptr == 0) return 0;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(ptr)) != cudaSuccess) {
    cudaGetLastError();
    throw CudaError("metrale: cudaPointerGetAttributes failed for a __cuda_array_interface__ pointer");
  }
  return attr.device;
}

nb::ndarray<> from_cuda_array_interface(nb::handle obj) {
  nb::dict cai = nb::cast<nb::dict>(obj.attr("__cuda_array_interface__"));
  const nb::tuple data = nb::cast<nb::tuple>(cai["data"]);
  const uintptr_t ptr = nb::cast<uintptr_t>(data[0]);
  const std::string typestr = nb::cast<std::string>(cai["typestr"]);
  const nb::tuple shape_t = nb::cast<nb::tuple>(cai["shape"]);
  const size_t ndim = nb::len(shape_t);
  if (ndim > 8) value_error("__cuda_array_interface__: ", ndim, " dimensions; expected at most 8");
  nb::dlpack::dtype dt;
  if (typestr.size() < 3 || (typestr[0] != '<' && typestr[0] != '|'))
    type_error("__cuda_array_interface__: typestr '", typestr, "'; expected a little-endian type");
  const char kind = typestr[1];
  const int bytes = std::stoi(typestr.substr(2));
  dt.bits = uint8_t(bytes * 8);
  dt.lanes = 1;
  if (kind == 'u') dt.code = uint8_t(nb::dlpack::dtype_code::UInt);
  else if (kind == 'i') dt.code = uint8_t(nb::dlpack::dtype_code::Int);
  else if (kind == 'f') dt.code = uint8_t(nb::dlpack::dtype_code::Float);
  else type_error("__cuda_array_interface__: typestr '", typestr, "'; expected an integer or float type");
  size_t shape[8];
  int64_t strides[8];
  for (size_t i = 0; i < ndim; ++i) shape[i] = nb::cast<size_t>(shape_t[i]);
  const bool has_strides = cai.contains("strides") && !cai["strides"].is_none();
  if (has_strides) {
    const nb::tuple st = nb::cast<nb::tuple>(cai["strides"]);
    for (size_t i = 0; i < ndim; ++i) {
      const int64_t b = nb::cast<int64_t>(st[i]);
      if (b % bytes != 0) value_error("__cuda_array_interface__: stride of ", b, " bytes is not a whole element");
      strides[i] = b / bytes;
    }
  } else {
    int64_t e = 1;
    for (size_t i = ndim; i-- > 0;) {
      strides[i] = e;
      e *= int64_t(shape[i]);
    }
  }
  const int device = pointer_device(ptr);
  return nb::ndarray<>(reinterpret_cast<void*>(ptr), ndim, shape, obj, strides, dt, nb::device::cuda::value, device);
}

}  // namespace
}  // namespace metrale_ext

using namespace metrale_ext;

NB_MODULE(_metrale, m) {
  m.doc() = "metrale private extension; use the `metrale` package";

  static nb::object cuda_error = nb::borrow(PyExc_RuntimeError);
  cuda_error = nb::steal(PyErr_NewExceptionWithDoc("metrale.CudaError",
                                                   "The CUDA runtime reported an error (no device, launch failure).",
                                                   PyExc_RuntimeError, nullptr));
  m.attr("CudaError") = cuda_error;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const metrale::InvalidArgument& e) {  // includes Unsupported
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const metrale::CudaError& e) {
      PyErr_SetString(cuda_error.ptr(), e.what());
    } catch (const metrale::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  nb::enum_<KvFormat> kv_format(m, "KvFormat");
  for (const KvFormatDesc& f : kKvFormats) kv_format.value(f.enum_name, f.format);

  nb::class_<KvCacheLayout>(m, "KvCacheLayout")
      .def_static("bf16", &KvCacheLayout::bf16, nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"),
                  nb::arg("head_dim"))
      .def_static("fp8", &KvCacheLayout::fp8, nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"),
                  nb::arg("head_dim"), nb::arg("cache_stride_elems") = 0)
      .def_static("nvfp4", &KvCacheLayout::nvfp4, nb::arg("num_blocks"), nb::arg("block_size"),
                  nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("block_stride_bytes") = 0,
                  nb::arg("data_section_bytes") = 0)
      .def_ro("format", &KvCacheLayout::format)
      .def_ro("num_blocks", &KvCacheLayout::num_blocks)
      .def_ro("block_size", &KvCacheLayout::block_size)
      .def_ro("num_kv_heads", &KvCacheLayout::num_kv_heads)
      .def_ro("head_dim", &KvCacheLayout::head_dim)
      .def_ro("page_stride_bytes", &KvCacheLayout::page_stride_bytes)
      .def_ro("data_section_bytes", &KvCacheLayout::data_section_bytes)
      // The NVFP4 group-scale rule by name ("max6" | "adaptive", docs/nvfp4_scales.md).
      .def_prop_ro("nvfp4_scales", [](const KvCacheLayout& l) { return std::string(to_string(l.nvfp4_scales)); })
      .def(
          "with_nvfp4_scales",
          [](const KvCacheLayout& l, const std::string& rule) {
            return l.with_nvfp4_scales(nvfp4_scale_rule_from_string(rule));
          },
          nb::arg("rule"))
      .def("validate", &KvCacheLayout::validate)
      .def_prop_ro("capacity_slots", &KvCacheLayout::capacity_slots)
      .def_prop_ro("cache_bytes", &KvCacheLayout::cache_bytes)
      .def_prop_ro("kv_bytes_per_token", &KvCacheLayout::kv_bytes_per_token)
      .def("__repr__", [](const KvCacheLayout& l) {
        return concat("KvCacheLayout(format=", to_string(l.format), ", num_blocks=", l.num_blocks,
                      ", block_size=", l.block_size, ", num_kv_heads=", l.num_kv_heads, ", head_dim=", l.head_dim,
                      ", page_stride_bytes=", l.page_stride_bytes, ", data_section_bytes=", l.data_section_bytes,
                      l.format == KvFormat::nvfp4 ? concat(", nvfp4_scales=", to_string(l.nvfp4_scales)) : "", ")");
      });

  // The smallest per-tensor scale format `f` takes (KvFormatDesc::min_tensor_scale).
  m.def("kv_min_tensor_scale", [](KvFormat f) { return kv_format_desc(f).min_tensor_scale; }, nb::arg("format"));
  m.attr("KV_SCALE_NAMES") = nb::make_tuple(kScaleNames[0], kScaleNames[1], kScaleNames[2], kScaleNames[3]);
  {
    nb::list dims;  // metrale/cache.hpp's kSupportedHeadDims
    for (int d : kSupportedHeadDims) dims.append(d);
    m.attr("SUPPORTED_HEAD_DIMS") = nb::tuple(dims);
  }
  m.def(
      "kv_scales_from_absmax",
      [](KvFormat f, float k_absmax, float v_absmax) { return to_tuple(kv_scales_from_absmax(f, k_absmax, v_absmax)); },
      nb::arg("format"), nb::arg("k_absmax"), nb::arg("v_absmax"));
  // The names of the two per-tensor scales format `f` takes (K's, V's), () for none.
  m.def(
      "kv_tensor_scale_names",
      [](KvFormat f) {
        const KvFormatDesc& d = kv_format_desc(f);
        if (d.tensor_scale == KvTensorScale::none) return nb::make_tuple();
        const std::string prefix = "cache.scales.";
        return nb::make_tuple(std::string(d.k_scale_name()).substr(prefix.size()),
                              std::string(d.v_scale_name()).substr(prefix.size()));
      },
      nb::arg("format"));
  m.def("fp8_scale_from_absmax", &fp8_scale_from_absmax, nb::arg("absmax"));
  m.def("nvfp4_global_scale_from_absmax", &nvfp4_global_scale_from_absmax, nb::arg("absmax"));
  m.def("splitk_workspace_bytes", &splitk_workspace_bytes, nb::arg("num_seqs"), nb::arg("num_q_heads"),
        nb::arg("head_dim"), nb::arg("num_splits"));
  m.def("max_splits", []() { return kMaxSplits; });

  bind_attention(m);
  bind_block_allocator(m);

  m.def("cpu_num_threads", &cpu::num_threads);
  m.def("cpu_set_num_threads", &cpu::set_num_threads, nb::arg("n"));
  m.def("cuda_available", &cuda::available);
  m.def(
      "cuda_device_info",
      [](int32_t device) {
        DeviceGuard g(Where{Dev::cuda, device});
        const cuda::DeviceInfo d = cuda::device_info();
        return std::make_tuple(d.device, d.num_sms, d.major, d.minor, d.l2_bytes, d.name);
      },
      nb::arg("device"));

  m.def("from_cuda_array_interface", &from_cuda_array_interface, nb::arg("obj"));
  m.def("cuda_pointer_device", &pointer_device, nb::arg("ptr"));
  m.def("reshape_and_cache", &reshape_and_cache, nb::arg("key"), nb::arg("value"), nb::arg("slot_mapping"),
        nb::arg("layout"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("scales"), nb::arg("skipped").none(),
        nb::arg("saturated").none(), nb::arg("stream"));
  m.def("bf16_absmax", &bf16_absmax, nb::arg("x"), nb::arg("absmax"), nb::arg("stream"), nb::arg("name") = "x");
}
