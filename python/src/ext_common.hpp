// What the extension's files share (private to python/src): DLPack array
// checks that name the argument (dtype, shape, strides, device), the
// conversion of q / K / V views to pointers and strides, the cache view,
// the CUDA device guard. Errors raised here are ValueError / TypeError.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/optional.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "metrale/metrale.hpp"

namespace nb = nanobind;
using namespace metrale;

namespace metrale_ext {

using In = nb::ndarray<nb::ro>;  // any dtype / device / shape; read-only arrays accepted
using Out = nb::ndarray<>;       // written to: must be writable

enum class Dev { cpu, cuda };
struct Where {
  Dev dev = Dev::cpu;
  int32_t id = 0;
  bool operator==(const Where& o) const { return dev == o.dev && (dev == Dev::cpu || id == o.id); }
  bool operator!=(const Where& o) const { return !(*this == o); }
};

inline std::string where_str(const Where& w) {
  return w.dev == Dev::cpu ? std::string("cpu") : "cuda:" + std::to_string(w.id);
}

// Messages are built without iostreams (see metrale/error.hpp).
using metrale::detail::concat;
template <class... T>
[[noreturn]] void value_error(const T&... parts) {
  throw nb::value_error(concat(parts...).c_str());
}
template <class... T>
[[noreturn]] void type_error(const T&... parts) {
  throw nb::type_error(concat(parts...).c_str());
}

inline std::string dtype_str(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (C(t.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: base = "dtype" + std::to_string(int(t.code)) + "_"; break;
  }
  std::string s = base + std::to_string(int(t.bits));
  if (t.lanes != 1) s += "x" + std::to_string(int(t.lanes));
  return s;
}

// Stride of dimension i in elements. DLPack producers may leave `strides`
// null for a compact row-major tensor (NumPy does for contiguous arrays):
// the strides are then implied by the shape.
template <class A>
int64_t stride(const A& a, size_t i) {
  if (a.stride_ptr() != nullptr) return a.stride(i);
  int64_t s = 1;
  for (size_t j = a.ndim(); j-- > i + 1;) s *= a.shape(j);
  return s;
}

template <class A>
std::string shape_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += concat(i ? ", " : "", a.shape(i));
  if (a.ndim() == 1) s += ",";
  return s + ")";
}
template <class A>
std::string strides_str(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += concat(i ? ", " : "", stride(a, i));
  return s + ") elements";
}

template <class A>
Where where_of(const A& a, const char* name) {
  const int dt = a.device_type();
  if (dt == nb::device::cpu::value) return {Dev::cpu, 0};
  if (dt == nb::device::cuda::value) return {Dev::cuda, a.device_id()};
  value_error("'", name, "': unsupported DLPack device type ", dt, "; expected a CPU (NumPy) or CUDA array");
}

// All arrays of one call must live on one device; returns it.
struct DeviceCheck {
  bool set = false;
  Where w;
  const char* first = nullptr;
  template <class A>
  void add(const A& a, const char* name) {
    const Where here = where_of(a, name);
    if (!set) {
      set = true;
      w = here;
      first = name;
    } else if (here != w) {
      value_error("'", name, "' is on ", where_str(here), " but '", first, "' is on ", where_str(w),
                  "; expected all arrays on one device");
    }
  }
};

template <class A>
bool is_dtype(const A& a, nb::dlpack::dtype_code code, int bits) {
  return a.dtype().code == uint8_t(code) && a.dtype().bits == bits && a.dtype().lanes == 1;
}
template <class A>
void check_bf16(const A& a, const char* name) {
  using C = nb::dlpack::dtype_code;
  if (!(is_dtype(a, C::Bfloat, 16) || is_dtype(a, C::UInt, 16) || is_dtype(a, C::Int, 16)))
    type_error("'", name, "': expected dtype bfloat16 (torch.bfloat16, or uint16 bf16 bit patterns for NumPy), got ",
               dtype_str(a.dtype()));
}
template <class A>
void check_dtype(const A& a, const char* name, nb::dlpack::dtype_code code, int bits, const char* what) {
  if (!is_dtype(a, code, bits)) type_error("'", name, "': expected dtype ", what, ", got ", dtype_str(a.dtype()));
}

template <class A>
bool c_contiguous(const A& a) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;  // empty: strides are meaningless (often reported as 0)
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && stride(a, i) != expect) return false;
    expect *= a.shape(i);
  }
  return true;
}
template <class A>
void check_contiguous(const A& a, const char* name) {
  if (!c_contiguous(a))
    value_error("'", name, "': expected a C-contiguous array, got shape ", shape_str(a), " strides ", strides_str(a));
}
template <class A>
int64_t nbytes(const A& a) {
  int64_t n = 1;
  for (size_t i = 0; i < a.ndim(); ++i) n *= a.shape(i);
  return n * (a.dtype().bits / 8) * a.dtype().lanes;
}

// Query rows (q) or output rows (out): `rows` x `heads` rows of `dim`
// contiguous bf16 values, head h of row r at ptr + r*row_stride +
// h*head_stride (elements). Accepted: (rows, heads, dim) with any row and
// head strides (a fused QKV slice; transformers' batch-1 query
// (1, heads, tokens, dim) read as (tokens, heads, dim), whose heads are
// strided); (rows, heads*dim) rows; transformers' (batch, heads, 1, dim)
// query and (batch, 1, heads, dim) output; (1, heads, tokens, dim) as
// tokens rows. The C++ validation checks the strides (multiples of 8, rows
// distinct).
struct Rows {
  const void* ptr;
  int64_t num_rows;
  int64_t stride;       // elements between rows
  int64_t head_stride;  // elements between heads
};
template <class A>
Rows bf16_rows(const A& a, const char* name, int64_t heads, int64_t dim) {
  check_bf16(a, name);
  const int64_t row = heads * dim;
  bool empty = false;  // strides of an empty array are meaningless (often reported as 0)
  for (size_t i = 0; i < a.ndim(); ++i) empty |= a.shape(i) == 0;
  auto unit_last = [&] { return empty || dim == 1 || stride(a, a.ndim() - 1) == 1; };
  Rows r{a.data(), 0, 0, dim};
  bool ok = false;
  if (a.ndim() == 2) {
    ok = a.shape(1) == row && (empty || row == 1 || stride(a, 1) == 1);
    r.num_rows = a.shape(0);
    r.stride = stride(a, 0);
  } else if (a.ndim() == 3) {
    ok = a.shape(1) == heads && a.shape(2) == dim && unit_last();
    r.num_rows = a.shape(0);
    r.stride = stride(a, 0);
    r.head_stride = stride(a, 1);
  } else if (a.ndim() == 4 && a.shape(3) == dim && unit_last()) {
    if (a.shape(1) == heads && a.shape(2) == 1) {  // (batch, heads, 1, dim)
      ok = true;
      r.num_rows = a.shape(0);
      r.stride = stride(a, 0);
      r.head_stride = stride(a, 1);
    } else if (a.shape(1) == 1 && a.shape(2) == heads) {  // (batch, 1, heads, dim)
      ok = true;
      r.num_rows = a.shape(0);
      r.stride = stride(a, 0);
      r.head_stride = stride(a, 2);
    } else if (a.shape(0) == 1 && a.shape(1) == heads) {  // (1, heads, tokens, dim)
      ok = true;
      r.num_rows = a.shape(2);
      r.stride = stride(a, 2);
      r.head_stride = stride(a, 1);
    }
  }
  if (!ok)
    value_error("'", name, "': expected bf16 of shape (rows, ", heads, ", ", dim, "), (rows, ", row, "), (rows, ",
                heads, ", 1, ", dim, "), (rows, 1, ", heads, ", ", dim, ") or (1, ", heads, ", rows, ", dim,
                ") with the last dimension contiguous, got shape ", shape_str(a), " strides ", strides_str(a));
  // Strides of a dimension of extent 1 are meaningless (often reported as
  // 1): replace them by valid ones.
  if (heads == 1) r.head_stride = dim;
  if (r.num_rows <= 1) r.stride = ((heads - 1) * r.head_stride + dim + 7) / 8 * 8;
  return r;
}
// The rows of an output (AttnArgs::out, ReduceArgs::out): C-contiguous
// (rows, heads, dim) in any of bf16_rows' shapes.
template <class A>
void check_out_rows(const A& a, const char* name, int64_t heads, int64_t dim, int64_t num_rows) {
  const Rows r = bf16_rows(a, name, heads, dim);
  if (r.num_rows != num_rows)
    value_error("'", name, "': expected ", num_rows, " rows of shape (", heads, ", ", dim, "), got shape ",
                shape_str(a));
  check_contiguous(a, name);
}

// The key or value input of a cache write: B groups (B = 1 but for a 4-D
// tensor whose tokens are not evenly spaced) of S tokens, head h of token s
// of group b at ptr + b*group_stride + s*token_stride + h*head_stride
// (elements), head_dim values contiguous.
struct KvInput {
  const bf16* ptr;
  int64_t groups, group_stride;
  int64_t tokens;  // per group
  int64_t token_stride, head_stride;
  int64_t total() const { return groups * tokens; }
};
// Accepted: (T, H*D) rows; (T, H, D) with any token and head strides (a
// transformers slice key[:, :, s], a permuted (S, H, D) view); 4-D
// (B, H, S, D), transformers' head-major layout, B*S tokens in b-major
// order (one group when the tokens are evenly spaced: S == 1, B == 1, or a
// transposed (B, S, H, D) projection; else one write per b); and (B, 1, H, D),
// one token per sequence in token-major order. The last dimension must be
// contiguous; the C++ validation checks the strides (multiples of 8, rows
// distinct).
template <class A>
KvInput kv_input(const A& a, const char* name, int64_t heads, int64_t dim) {
  check_bf16(a, name);
  bool empty = false;  // strides of an empty array are meaningless (often reported as 0)
  for (size_t i = 0; i < a.ndim(); ++i) empty |= a.shape(i) == 0;
  auto last_contiguous = [&] { return empty || a.shape(a.ndim() - 1) == 1 || stride(a, a.ndim() - 1) == 1; };
  KvInput r{static_cast<const bf16*>(a.data()), 1, 0, 0, 0, dim};
  bool ok = a.ndim() >= 2 && a.shape(a.ndim() - 1) == (a.ndim() == 2 ? heads * dim : dim) && last_contiguous();
  if (ok && a.ndim() == 2) {
    r.tokens = a.shape(0);
    r.token_stride = stride(a, 0);
  } else if (ok && a.ndim() == 3) {
    ok = a.shape(1) == heads;
    r.tokens = a.shape(0);
    r.token_stride = stride(a, 0);
    r.head_stride = stride(a, 1);
  } else if (ok && a.ndim() == 4 && a.shape(1) == heads) {  // (B, H, S, D)
    const int64_t B = a.shape(0), S = a.shape(2);
    r.head_stride = stride(a, 1);
    if (S == 1 || B == 1 || stride(a, 0) == S * stride(a, 2)) {
      r.tokens = B * S;
      r.token_stride = S == 1 ? stride(a, 0) : stride(a, 2);
    } else {
      r.groups = B;
      r.group_stride = stride(a, 0);
      r.tokens = S;
      r.token_stride = stride(a, 2);
    }
  } else if (ok && a.ndim() == 4 && a.shape(1) == 1 && a.shape(2) == heads) {  // (B, 1, H, D)
    r.tokens = a.shape(0);
    r.token_stride = stride(a, 0);
    r.head_stride = stride(a, 2);
  } else {
    ok = false;
  }
  if (!ok)
    value_error("'", name, "': expected bf16 of shape (rows, ", heads, ", ", dim, "), (rows, ", heads * dim,
                "), (batch, ", heads, ", seq, ", dim, ") or (batch, 1, ", heads, ", ", dim,
                ") with the last dimension contiguous, got shape ", shape_str(a), " strides ", strides_str(a));
  // Strides of a dimension of extent 1 are meaningless (often reported as 1):
  // replace them by valid ones.
  if (heads == 1) r.head_stride = dim;
  if (r.tokens <= 1) r.token_stride = ((heads - 1) * r.head_stride + dim + 7) / 8 * 8;
  return r;
}
// Makes `r` hold B groups of S tokens (it holds one group of B*S evenly
// spaced tokens, or already B groups).
inline void regroup(KvInput& r, int64_t B, int64_t S) {
  if (r.groups == B || r.groups != 1) return;
  r.groups = B;
  r.group_stride = S * r.token_stride;
  r.tokens = S;
}

template <class A>
void check_cache_buffer(const A& a, const char* name, const KvCacheLayout& layout) {
  check_contiguous(a, name);
  if (nbytes(a) < layout.cache_bytes())
    value_error("'", name, "': ", nbytes(a), " bytes; expected at least layout.cache_bytes() = ", layout.cache_bytes());
}

// Makes the array's CUDA device current for the duration of a call.
struct DeviceGuard {
  int prev = -1;
  explicit DeviceGuard(const Where& w) {
    if (w.dev != Dev::cuda) return;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) throw CudaError("metrale: cudaGetDevice failed (no usable CUDA device?)");
    if (cur != w.id) {
      if (cudaSetDevice(w.id) != cudaSuccess) throw CudaError("metrale: cudaSetDevice failed");
      prev = cur;
    }
  }
  ~DeviceGuard() {
    if (prev >= 0) cudaSetDevice(prev);
  }
};

inline cuda::Stream as_stream(uintptr_t s) { return reinterpret_cast<cuda::Stream>(s); }

// KvScales as Python sees it: the one place that orders its fields (the
// package reads the order from _metrale.KV_SCALE_NAMES).
using ScalesTuple = std::tuple<float, float, float, float>;  // k_scale, v_scale, k_global_scale, v_global_scale
inline const char* const kScaleNames[4] = {"k_scale", "v_scale", "k_global_scale", "v_global_scale"};
inline ScalesTuple to_tuple(const KvScales& s) {
  return std::make_tuple(s.k_scale, s.v_scale, s.k_global_scale, s.v_global_scale);
}
inline KvScales from_tuple(const ScalesTuple& t) {
  KvScales s;
  s.k_scale = std::get<0>(t);
  s.v_scale = std::get<1>(t);
  s.k_global_scale = std::get<2>(t);
  s.v_global_scale = std::get<3>(t);
  return s;
}

template <class K, class V>
KvCacheView make_view(const KvCacheLayout& layout, const K& k, const V& v, const ScalesTuple& s) {
  check_cache_buffer(k, "k_cache", layout);
  check_cache_buffer(v, "v_cache", layout);
  KvCacheView view;
  view.layout = layout;
  view.k = const_cast<void*>(k.data());
  view.v = const_cast<void*>(v.data());
  view.scales = from_tuple(s);
  return view;
}

// block_tables int32 [num_seqs, max_blocks_per_seq >= 1], seq_lens int32 [num_seqs].
inline void check_tables(const In& block_tables, const In& seq_lens, int64_t num_seqs) {
  check_dtype(block_tables, "block_tables", nb::dlpack::dtype_code::Int, 32, "int32");
  if (block_tables.ndim() != 2 || block_tables.shape(0) != num_seqs || block_tables.shape(1) < 1 ||
      !c_contiguous(block_tables))
    value_error("'block_tables': expected a C-contiguous int32 array of shape (num_seqs = ", num_seqs,
                ", max_blocks_per_seq >= 1), got shape ", shape_str(block_tables));
  check_dtype(seq_lens, "seq_lens", nb::dlpack::dtype_code::Int, 32, "int32");
  if (seq_lens.ndim() != 1 || seq_lens.shape(0) != num_seqs || !c_contiguous(seq_lens))
    value_error("'seq_lens': expected a contiguous int32 array of shape (", num_seqs, ",), got shape ",
                shape_str(seq_lens));
}

}  // namespace metrale_ext
