// _metrale: the private nanobind extension under the `metrale` Python package.
//
// Thin on purpose: every function takes arrays as nb::ndarray (DLPack, the
// buffer protocol: torch, CuPy, JAX, NumPy), checks dtype / shape / strides /
// device and dispatches to metrale::cpu (host arrays) or metrale::cuda (CUDA
// arrays, on the stream handle passed in, never synchronising). The typed,
// documented API lives in python/metrale/__init__.py.
//
// Errors: metrale::InvalidArgument (and Unsupported) -> ValueError,
// metrale::CudaError -> metrale.CudaError (a RuntimeError); argument checks
// done here raise ValueError / TypeError naming the argument.

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

namespace {

using In = nb::ndarray<nb::ro>;  // any dtype / device / shape; read-only arrays accepted
using Out = nb::ndarray<>;       // written to: must be writable

enum class Dev { cpu, cuda };
struct Where {
  Dev dev = Dev::cpu;
  int32_t id = 0;
  bool operator==(const Where& o) const { return dev == o.dev && (dev == Dev::cpu || id == o.id); }
  bool operator!=(const Where& o) const { return !(*this == o); }
};

std::string where_str(const Where& w) { return w.dev == Dev::cpu ? std::string("cpu") : "cuda:" + std::to_string(w.id); }

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

std::string dtype_str(nb::dlpack::dtype t) {
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

// bf16 rows of H*D contiguous values: [rows, H*D] or [rows, H, D], row stride free.
struct Rows {
  const void* ptr;
  int64_t num_rows;
  int64_t stride;  // elements
};
template <class A>
Rows bf16_rows(const A& a, const char* name, int64_t heads, int64_t dim) {
  check_bf16(a, name);
  const int64_t row = heads * dim;
  bool ok = false;
  if (a.ndim() >= 1 && a.shape(0) == 0) {
    ok = (a.ndim() == 2 && a.shape(1) == row) || (a.ndim() == 3 && a.shape(1) == heads && a.shape(2) == dim);
  } else if (a.ndim() == 2) {
    ok = a.shape(1) == row && (row == 1 || stride(a, 1) == 1);
  } else if (a.ndim() == 3) {
    ok = a.shape(1) == heads && a.shape(2) == dim && (dim == 1 || stride(a, 2) == 1) &&
         (heads == 1 || stride(a, 1) == dim);
  } else if (a.ndim() == 4 && (a.shape(1) == 1 || a.shape(2) == 1)) {
    // transformers' (batch, heads, 1, dim) query and (batch, 1, heads, dim) output
    const size_t h = a.shape(1) == 1 ? 2 : 1;
    ok = a.shape(h) == heads && a.shape(3) == dim && (dim == 1 || stride(a, 3) == 1) &&
         (heads == 1 || stride(a, h) == dim);
  }
  if (!ok)
    value_error("'", name, "': expected shape (rows, ", heads, ", ", dim, "), (rows, ", row, "), (rows, ", heads,
                ", 1, ", dim, ") or (rows, 1, ", heads, ", ", dim,
                ") with each row's values contiguous, got shape ", shape_str(a), " strides ", strides_str(a));
  const int64_t n = a.shape(0);
  int64_t row_stride = stride(a, 0);
  if (n <= 1) row_stride = (row + 7) / 8 * 8;
  if (row_stride < row || row_stride % 8 != 0)
    value_error("'", name, "': row stride ", row_stride, " elements; expected >= ", row,
                " and a multiple of 8 (16-byte aligned rows)");
  return Rows{a.data(), n, row_stride};
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
void regroup(KvInput& r, int64_t B, int64_t S) {
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

cuda::Stream as_stream(uintptr_t s) { return reinterpret_cast<cuda::Stream>(s); }

using ScalesTuple = std::tuple<float, float, float, float>;  // k_scale, v_scale, k_global_scale, v_global_scale

template <class K, class V>
KvCacheView make_view(const KvCacheLayout& layout, const K& k, const V& v, const ScalesTuple& s) {
  check_cache_buffer(k, "k_cache", layout);
  check_cache_buffer(v, "v_cache", layout);
  KvCacheView view;
  view.layout = layout;
  view.k = const_cast<void*>(k.data());
  view.v = const_cast<void*>(v.data());
  view.scales.k_scale = std::get<0>(s);
  view.scales.v_scale = std::get<1>(s);
  view.scales.k_global_scale = std::get<2>(s);
  view.scales.v_global_scale = std::get<3>(s);
  return view;
}

// ---- operations ----

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

// block_tables int32 [num_seqs, max_blocks_per_seq >= 1], seq_lens int32 [num_seqs].
void check_tables(const In& block_tables, const In& seq_lens, int64_t num_seqs) {
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

// A decode call's arguments, checked and converted once: the DecodeArgs and
// where they live. `out` is unused (may be anything) for the split-K pass.
struct BoundDecode {
  DecodeArgs args;
  DeviceCheck where;
};

BoundDecode bind_decode(const In& q, int32_t num_q_heads, const KvCacheLayout& layout, const In& k_cache,
                        const In& v_cache, const ScalesTuple& scales, const In& block_tables, const In& seq_lens,
                        int32_t sliding_window, float sm_scale, const Out* out) {
  layout.validate();
  BoundDecode b;
  DeviceCheck& dc = b.where;
  dc.add(q, "q");
  dc.add(k_cache, "k_cache");
  dc.add(v_cache, "v_cache");
  dc.add(block_tables, "block_tables");
  dc.add(seq_lens, "seq_lens");
  if (out) dc.add(*out, "out");
  const int64_t D = layout.head_dim;
  if (num_q_heads <= 0 || num_q_heads % layout.num_kv_heads != 0)
    value_error("'num_q_heads' = ", num_q_heads, "; expected a positive multiple of the cache's num_kv_heads = ",
                layout.num_kv_heads, " (GQA: num_q_heads % num_kv_heads == 0)");
  const Rows qr = bf16_rows(q, "q", num_q_heads, D);
  const int64_t num_seqs = qr.num_rows;

  check_tables(block_tables, seq_lens, num_seqs);

  DecodeArgs& a = b.args;
  a.q = static_cast<const bf16*>(qr.ptr);
  a.q_stride = qr.stride;
  a.num_seqs = int32_t(num_seqs);
  a.num_q_heads = num_q_heads;
  a.cache = make_view(layout, k_cache, v_cache, scales);
  a.block_tables = static_cast<const int32_t*>(block_tables.data());
  a.max_blocks_per_seq = int32_t(block_tables.shape(1));
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data());
  a.sliding_window = sliding_window;
  a.sm_scale = sm_scale;

  if (out) {
    const Rows orow = bf16_rows(*out, "out", num_q_heads, D);
    if (orow.num_rows != num_seqs)
      value_error("'out': expected ", num_seqs, " rows of shape (", num_q_heads, ", ", D, "), got shape ",
                  shape_str(*out));
    check_contiguous(*out, "out");
    a.out = static_cast<bf16*>(out->data());
  }
  return b;
}

// The split-K workspace of `a` for num_splits splits.
SplitKWorkspace bind_workspace(const std::optional<Out>& workspace, const DecodeArgs& a, int32_t num_splits) {
  if (!workspace) value_error("'workspace': required when the plan merges ", num_splits, " splits through it");
  check_dtype(*workspace, "workspace", nb::dlpack::dtype_code::Float, 32, "float32");
  check_contiguous(*workspace, "workspace");
  SplitKWorkspace ws;
  ws.num_splits = num_splits;
  ws.data = static_cast<float*>(workspace->data());
  ws.bytes = size_t(nbytes(*workspace));
  const size_t need = splitk_workspace_bytes(a.num_seqs, a.num_q_heads, a.cache.layout.head_dim, num_splits);
  if (ws.bytes < need)
    value_error("'workspace': ", ws.bytes, " bytes; expected at least ", need,
                " (num_seqs * num_q_heads * num_splits * (head_dim + 2) float32)");
  if (reinterpret_cast<uintptr_t>(ws.data) % 16 != 0)
    value_error("'workspace': data pointer not 16-byte aligned; expected a 16-byte aligned float32 array");
  return ws;
}

void decode_single(const In& q, int32_t num_q_heads, const KvCacheLayout& layout, const In& k_cache,
                   const In& v_cache, const ScalesTuple& scales, const In& block_tables, const In& seq_lens,
                   int32_t sliding_window, float sm_scale, const Out& out, uintptr_t stream) {
  BoundDecode b = bind_decode(q, num_q_heads, layout, k_cache, v_cache, scales, block_tables, seq_lens,
                              sliding_window, sm_scale, &out);
  if (b.args.num_seqs == 0) return;
  if (b.where.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    return cpu::paged_decode_attn(b.args);
  }
  DeviceGuard g(b.where.w);
  cuda::paged_decode_attn(b.args, as_stream(stream));
}

void decode_splitk(const In& q, int32_t num_q_heads, const KvCacheLayout& layout, const In& k_cache,
                   const In& v_cache, const ScalesTuple& scales, const In& block_tables, const In& seq_lens,
                   int32_t sliding_window, float sm_scale, const Out& workspace, int32_t num_splits,
                   uintptr_t stream) {
  BoundDecode b = bind_decode(q, num_q_heads, layout, k_cache, v_cache, scales, block_tables, seq_lens,
                              sliding_window, sm_scale, nullptr);
  b.where.add(workspace, "workspace");
  const SplitKWorkspace ws = bind_workspace(workspace, b.args, num_splits);
  if (b.args.num_seqs == 0) return;
  if (b.where.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    return cpu::paged_decode_attn_splitk(b.args, ws);
  }
  DeviceGuard g(b.where.w);
  cuda::paged_decode_attn_splitk(b.args, ws, as_stream(stream));
}

void run_decode(const DecodePlan& plan, const In& q, const KvCacheLayout& layout, const In& k_cache,
                const In& v_cache, const ScalesTuple& scales, const In& block_tables, const In& seq_lens,
                float sm_scale, const Out& out, std::optional<Out> workspace, int32_t sliding_window,
                uintptr_t stream) {
  BoundDecode b = bind_decode(q, plan.problem.num_q_heads, layout, k_cache, v_cache, scales, block_tables, seq_lens,
                              sliding_window, sm_scale, &out);
  SplitKWorkspace ws;
  if (plan.merge == DecodeMerge::workspace) {
    if (workspace) b.where.add(*workspace, "workspace");
    ws = bind_workspace(workspace, b.args, plan.num_splits);
  }
  if (b.args.num_seqs == 0) return;
  if (b.where.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    return cpu::run_decode(plan, b.args, ws);
  }
  DeviceGuard g(b.where.w);
  cuda::run_decode(plan, b.args, ws, as_stream(stream));
}

// Query runs (SYSTEM.md 8): paged_attn (plan null) or run_attn with `plan`.
void attend(const DecodePlan* plan, const In& q, int32_t num_q_heads, const KvCacheLayout& layout,
            const In& k_cache, const In& v_cache, const ScalesTuple& scales, const In& q_start,
            const In& block_tables, const In& seq_lens, int32_t sliding_window, float sm_scale,
            std::optional<In> sinks, float softcap, const Out& out, std::optional<Out> lse,
            std::optional<Out> workspace, int32_t max_q_len, uintptr_t stream) {
  layout.validate();
  DeviceCheck dc;
  dc.add(q, "q");
  dc.add(k_cache, "k_cache");
  dc.add(v_cache, "v_cache");
  dc.add(q_start, "q_start");
  dc.add(block_tables, "block_tables");
  dc.add(seq_lens, "seq_lens");
  dc.add(out, "out");
  if (sinks) dc.add(*sinks, "sinks");
  if (lse) dc.add(*lse, "lse");
  if (workspace) dc.add(*workspace, "workspace");
  const int64_t D = layout.head_dim;
  if (num_q_heads <= 0 || num_q_heads % layout.num_kv_heads != 0)
    value_error("'num_q_heads' = ", num_q_heads, "; expected a positive multiple of the cache's num_kv_heads = ",
                layout.num_kv_heads);
  const Rows qr = bf16_rows(q, "q", num_q_heads, D);
  const int64_t num_seqs = block_tables.ndim() == 2 ? block_tables.shape(0) : -1;
  check_tables(block_tables, seq_lens, num_seqs);
  check_dtype(q_start, "q_start", nb::dlpack::dtype_code::Int, 32, "int32");
  if (q_start.ndim() != 1 || q_start.shape(0) != num_seqs + 1 || !c_contiguous(q_start))
    value_error("'q_start': expected a contiguous int32 array of shape (num_seqs + 1 = ", num_seqs + 1,
                ",), got shape ", shape_str(q_start));
  check_bf16(out, "out");
  check_contiguous(out, "out");
  if (!((out.ndim() == 3 && out.shape(0) == qr.num_rows && out.shape(1) == num_q_heads && out.shape(2) == D) ||
        (out.ndim() == 2 && out.shape(0) == qr.num_rows && out.shape(1) == num_q_heads * D)))
    value_error("'out': expected shape (", qr.num_rows, ", ", num_q_heads, ", ", D, "), got shape ", shape_str(out));
  PagedAttnArgs a;
  a.q = static_cast<const bf16*>(qr.ptr);
  a.q_stride = qr.stride;
  a.q_start = static_cast<const int32_t*>(q_start.data());
  a.num_seqs = int32_t(num_seqs);
  a.num_q_rows = int32_t(qr.num_rows);
  a.num_q_heads = num_q_heads;
  a.cache = make_view(layout, k_cache, v_cache, scales);
  a.block_tables = static_cast<const int32_t*>(block_tables.data());
  a.max_blocks_per_seq = int32_t(block_tables.shape(1));
  a.seq_lens = static_cast<const int32_t*>(seq_lens.data());
  a.sliding_window = sliding_window;
  a.sm_scale = sm_scale;
  a.softcap = softcap;
  a.max_q_len = max_q_len;
  a.out = static_cast<bf16*>(out.data());
  if (sinks) {
    check_dtype(*sinks, "sinks", nb::dlpack::dtype_code::Float, 32, "float32");
    if (sinks->ndim() != 1 || sinks->shape(0) != num_q_heads || !c_contiguous(*sinks))
      value_error("'sinks': expected a contiguous float32 array of shape (", num_q_heads, ",), got shape ",
                  shape_str(*sinks));
    a.sinks = static_cast<const float*>(sinks->data());
  }
  if (lse) {
    check_dtype(*lse, "lse", nb::dlpack::dtype_code::Float, 32, "float32");
    check_contiguous(*lse, "lse");
    if (nbytes(*lse) != qr.num_rows * num_q_heads * 4)
      value_error("'lse': expected ", qr.num_rows, " x ", num_q_heads, " float32, got shape ", shape_str(*lse));
    a.lse = static_cast<float*>(lse->data());
  }
  SplitKWorkspace ws;
  if (plan && plan->merge == DecodeMerge::workspace) {
    if (!workspace) value_error("'workspace': required (the plan merges ", plan->num_splits, " splits through it)");
    check_dtype(*workspace, "workspace", nb::dlpack::dtype_code::Float, 32, "float32");
    check_contiguous(*workspace, "workspace");
    ws.data = static_cast<float*>(workspace->data());
    ws.bytes = size_t(nbytes(*workspace));
    ws.num_splits = plan->num_splits;
  }
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    if (plan) return cpu::run_attn(*plan, a, ws);
    return cpu::paged_attn(a);
  }
  DeviceGuard g(dc.w);
  if (plan) return cuda::run_attn(*plan, a, ws, as_stream(stream));
  cuda::paged_attn(a, as_stream(stream));
}

void reduce(const In& workspace, int32_t num_q_heads, int32_t head_dim, int32_t num_splits, const Out& out,
            uintptr_t stream) {
  DeviceCheck dc;
  dc.add(workspace, "workspace");
  dc.add(out, "out");
  check_dtype(workspace, "workspace", nb::dlpack::dtype_code::Float, 32, "float32");
  check_contiguous(workspace, "workspace");
  check_bf16(out, "out");
  check_contiguous(out, "out");
  if (out.ndim() < 1) value_error("'out': expected shape (num_seqs, ", num_q_heads, ", ", head_dim, ")");
  const int64_t num_seqs = out.shape(0);
  const bool shape_ok =
      (out.ndim() == 3 && out.shape(1) == num_q_heads && out.shape(2) == head_dim) ||
      (out.ndim() == 2 && out.shape(1) == int64_t(num_q_heads) * head_dim);
  if (!shape_ok)
    value_error("'out': expected shape (num_seqs, ", num_q_heads, ", ", head_dim, "), got shape ", shape_str(out));
  ReduceArgs r;
  r.workspace = static_cast<const float*>(workspace.data());
  r.workspace_bytes = size_t(nbytes(workspace));
  r.num_seqs = int32_t(num_seqs);
  r.num_q_heads = num_q_heads;
  r.head_dim = head_dim;
  r.num_splits = num_splits;
  r.out = static_cast<bf16*>(out.data());
  if (num_seqs == 0) return;
  if (dc.w.dev == Dev::cpu) {
    nb::gil_scoped_release nogil;
    cpu::paged_decode_attn_reduce(r);
    return;
  }
  DeviceGuard g(dc.w);
  cuda::paged_decode_attn_reduce(r, as_stream(stream));
}

void validate_tables(const KvCacheLayout& layout, const In& block_tables, const In& seq_lens, int32_t sliding_window) {
  if (where_of(block_tables, "block_tables").dev != Dev::cpu || where_of(seq_lens, "seq_lens").dev != Dev::cpu)
    value_error("validate_block_tables: expected host (CPU) copies of 'block_tables' and 'seq_lens'");
  check_dtype(block_tables, "block_tables", nb::dlpack::dtype_code::Int, 32, "int32");
  check_dtype(seq_lens, "seq_lens", nb::dlpack::dtype_code::Int, 32, "int32");
  check_contiguous(block_tables, "block_tables");
  check_contiguous(seq_lens, "seq_lens");
  if (block_tables.ndim() != 2 || seq_lens.ndim() != 1 || block_tables.shape(0) != seq_lens.shape(0))
    value_error("'block_tables' / 'seq_lens': expected shapes (num_seqs, max_blocks_per_seq) and (num_seqs,), got ",
                shape_str(block_tables), " and ", shape_str(seq_lens));
  if (seq_lens.shape(0) == 0) return;
  validate_block_tables(layout, static_cast<const int32_t*>(block_tables.data()), int32_t(block_tables.shape(1)),
                        static_cast<const int32_t*>(seq_lens.data()), int32_t(seq_lens.shape(0)), sliding_window);
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
      .def("validate", &KvCacheLayout::validate)
      .def_prop_ro("capacity_slots", &KvCacheLayout::capacity_slots)
      .def_prop_ro("cache_bytes", &KvCacheLayout::cache_bytes)
      .def_prop_ro("kv_bytes_per_token", &KvCacheLayout::kv_bytes_per_token)
      .def("__repr__", [](const KvCacheLayout& l) {
        return concat("KvCacheLayout(format=", to_string(l.format), ", num_blocks=", l.num_blocks,
                      ", block_size=", l.block_size, ", num_kv_heads=", l.num_kv_heads, ", head_dim=", l.head_dim,
                      ", page_stride_bytes=", l.page_stride_bytes, ", data_section_bytes=", l.data_section_bytes, ")");
      });

  m.def("fp8_scale_from_absmax", &fp8_scale_from_absmax, nb::arg("absmax"));
  m.def("nvfp4_global_scale_from_absmax", &nvfp4_global_scale_from_absmax, nb::arg("absmax"));
  m.def("splitk_workspace_bytes", &splitk_workspace_bytes, nb::arg("num_seqs"), nb::arg("num_q_heads"),
        nb::arg("head_dim"), nb::arg("num_splits"));
  m.def("max_splits", []() { return kMaxSplits; });

  nb::class_<DecodePlan>(m, "DecodePlan")
      .def_prop_ro("num_seqs", [](const DecodePlan& p) { return p.problem.num_seqs; })
      .def_prop_ro("num_q_heads", [](const DecodePlan& p) { return p.problem.num_q_heads; })
      .def_prop_ro("layout", [](const DecodePlan& p) { return p.problem.layout; })
      .def_prop_ro("max_seq_len", [](const DecodePlan& p) { return p.problem.max_seq_len; })
      .def_prop_ro("sliding_window", [](const DecodePlan& p) { return p.problem.sliding_window; })
      .def_ro("num_splits", &DecodePlan::num_splits)
      .def_ro("pair_kv_heads", &DecodePlan::pair_kv_heads)
      .def_prop_ro("load_path", [](const DecodePlan& p) { return std::string(to_string(p.load_path)); })
      .def_prop_ro("merge", [](const DecodePlan& p) { return std::string(to_string(p.merge)); })
      .def_prop_ro("grid", [](const DecodePlan& p) {
        return std::make_tuple(p.grid_x(p.problem.num_seqs), p.num_splits);
      })
      .def_ro("workspace_bytes", &DecodePlan::workspace_bytes)
      .def_prop_ro("max_q_len", [](const DecodePlan& p) { return p.problem.max_q_len; })
      .def_prop_ro("runs_kernel", [](const DecodePlan& p) { return p.kernel().runs; })
      .def_ro("col_tiles", &DecodePlan::col_tiles)
      .def_ro("head_dim_parts", &DecodePlan::head_dim_parts)
      .def_ro("head_tiles", &DecodePlan::head_tiles)
      .def_ro("tile_band", &DecodePlan::tile_band)
      .def_ro("tile_pairs", &DecodePlan::tile_pairs)
      .def_ro("prefill", &DecodePlan::prefill)
      .def("__repr__", [](const DecodePlan& p) {
        return concat("DecodePlan(num_splits=", p.num_splits, ", merge=", to_string(p.merge),
                      ", load_path=", to_string(p.load_path), ", pair_kv_heads=", p.pair_kv_heads ? "True" : "False", ", prefill=", p.prefill ? "True" : "False",
                      ", grid=(", p.grid_x(p.problem.num_seqs), ", ", p.num_splits, "), workspace_bytes=",
                      p.workspace_bytes, ")");
      });

  // device < 0: the CPU backend's target; else CUDA device `device`.
  m.def(
      "plan_decode",
      [](int32_t num_seqs, int32_t num_q_heads, const KvCacheLayout& layout, int32_t max_seq_len,
         int32_t sliding_window, int32_t device, int32_t num_splits, const std::string& pairing,
         const std::string& load_path, const std::string& merge, int32_t max_q_len, int32_t num_q_rows,
         bool attn_options, const std::string& prefill) {
        DecodeProblem p;
        p.num_seqs = num_seqs;
        p.num_q_heads = num_q_heads;
        p.layout = layout;
        p.max_seq_len = max_seq_len;
        p.sliding_window = sliding_window;
        p.max_q_len = max_q_len;
        p.num_q_rows = num_q_rows;
        p.attn_options = attn_options;
        DecodePlanOptions o;
        o.num_splits = num_splits;
        o.pairing = decode_pairing_from_string(pairing);  // InvalidArgument -> ValueError
        o.load_path = decode_load_path_from_string(load_path);
        o.merge = decode_merge_from_string(merge);
        o.prefill = decode_prefill_from_string(prefill);
        if (device < 0) return plan_decode(p, cpu::decode_target(), o);
        DeviceGuard g(Where{Dev::cuda, device});
        return plan_decode(p, cuda::decode_target(), o);
      },
      nb::arg("num_seqs"), nb::arg("num_q_heads"), nb::arg("layout"), nb::arg("max_seq_len"),
      nb::arg("sliding_window"), nb::arg("device"), nb::arg("num_splits"), nb::arg("pairing"), nb::arg("load_path"),
      nb::arg("merge"), nb::arg("max_q_len") = 1, nb::arg("num_q_rows") = 0, nb::arg("attn_options") = false,
      nb::arg("prefill") = "automatic");
  m.def("attend", &attend, nb::arg("plan").none(), nb::arg("q"), nb::arg("num_q_heads"), nb::arg("layout"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("scales"), nb::arg("q_start"), nb::arg("block_tables"),
        nb::arg("seq_lens"), nb::arg("sliding_window"), nb::arg("sm_scale"), nb::arg("sinks").none(),
        nb::arg("softcap"), nb::arg("out"), nb::arg("lse").none(), nb::arg("workspace").none(),
        nb::arg("max_q_len"), nb::arg("stream"));

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
  m.def("decode_single", &decode_single, nb::arg("q"), nb::arg("num_q_heads"), nb::arg("layout"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("scales"), nb::arg("block_tables"), nb::arg("seq_lens"),
        nb::arg("sliding_window"), nb::arg("sm_scale"), nb::arg("out"), nb::arg("stream"));
  m.def("decode_splitk", &decode_splitk, nb::arg("q"), nb::arg("num_q_heads"), nb::arg("layout"),
        nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("scales"), nb::arg("block_tables"), nb::arg("seq_lens"),
        nb::arg("sliding_window"), nb::arg("sm_scale"), nb::arg("workspace"), nb::arg("num_splits"),
        nb::arg("stream"));
  m.def("run_decode", &run_decode, nb::arg("plan"), nb::arg("q"), nb::arg("layout"), nb::arg("k_cache"),
        nb::arg("v_cache"), nb::arg("scales"), nb::arg("block_tables"), nb::arg("seq_lens"), nb::arg("sm_scale"),
        nb::arg("out"), nb::arg("workspace").none(), nb::arg("sliding_window"), nb::arg("stream"));
  m.def("reduce", &reduce, nb::arg("workspace"), nb::arg("num_q_heads"), nb::arg("head_dim"), nb::arg("num_splits"),
        nb::arg("out"), nb::arg("stream"));
  m.def("validate_block_tables", &validate_tables, nb::arg("layout"), nb::arg("block_tables"), nb::arg("seq_lens"),
        nb::arg("sliding_window"));
}
