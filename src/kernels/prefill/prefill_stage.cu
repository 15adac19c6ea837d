// The staging kernel (prefill_stage.hpp). A CTA takes page slot i of
// sequence s, of K (z 0) or V (z 1): the (first + i)-th page of the
// block-table row, `first` the first page of the run's attended span (the
// prefill kernel's own rule, query_range of the run's first row), and
// writes it as bf16 (the decode kernel's exact f16 operands, code or code *
// group scale * 2^-6, widened: the per-tensor factors stay folded into the
// prefill kernel's logit and V factors) to staged page s * slots + i, and
// that id into the staged table. A page id outside the cache stays one
// (-1), so the prefill kernel's page check makes the run NaN as over the
// cache itself; a sequence past the plan's bounds (longer than table_stride
// pages, or a span of more than `slots` pages) gets -1 everywhere: NaN rows,
// never a write out of the region.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/attention_params.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/common/mma.cuh"
#include "kernels/common/sequence_run.cuh"
#include "kernels/formats/fp8.cuh"
#include "kernels/formats/nvfp4.cuh"
#include "kernels/prefill/prefill_stage.hpp"
#include "plan/prefill_staging.hpp"

namespace metrale::kernels {
namespace {

constexpr int kStageThreads = 256;

// Two f16 -> two bf16, exact for the staged values (at most 6 significant bits).
__device__ __forceinline__ uint32_t f16x2_to_bf16x2(uint32_t h) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}
__device__ __forceinline__ uint4 f16x8_to_bf16x8(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return make_uint4(f16x2_to_bf16x2(a), f16x2_to_bf16x2(b), f16x2_to_bf16x2(c), f16x2_to_bf16x2(d));
}

// Chunks of 8 elements of a page's `rows` rows of head_dim D, one per thread
// and step: coalesced loads of their codes and 16-byte stores of their bf16
// values, consecutive threads on consecutive chunks; kBatch chunks' loads in
// flight before any store.
constexpr int kBatch = 4;
template <class Load, class Store>
__device__ __forceinline__ void for_each_chunk(int32_t chunks, Load load, Store store) {
  using Raw = decltype(load(0));
  for (int32_t i0 = int32_t(threadIdx.x); i0 < chunks; i0 += kBatch * kStageThreads) {
    Raw raw[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (i0 + b * kStageThreads < chunks) raw[b] = load(i0 + b * kStageThreads);
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      if (i0 + b * kStageThreads < chunks) store(i0 + b * kStageThreads, raw[b]);
  }
}

// `rows` rows of head_dim D from a page at `src` to a bf16 page at `dst`.
template <class Fmt>
struct StageRows;

// FP8: 8 codes (8 bytes) per chunk.
template <>
struct StageRows<Fp8Format> {
  __device__ static void copy(const uint8_t* src, int64_t /*scale_offset*/, bf16* dst, int32_t rows, int32_t D) {
    const uint2* codes = reinterpret_cast<const uint2*>(src);
    uint4* out = reinterpret_cast<uint4*>(dst);
    for_each_chunk(
        rows * D / 8, [&](int32_t i) { return __ldg(codes + i); },
        [&](int32_t i, const uint2& c) {
          uint32_t h[4];
          e4m3x4_to_f16x2x2(c.x, h[0], h[1]);
          e4m3x4_to_f16x2x2(c.y, h[2], h[3]);
          out[i] = f16x8_to_bf16x8(h[0], h[1], h[2], h[3]);
        });
  }
};

// NVFP4: 8 codes (a word) and their group's scale per chunk; a word's low
// nibbles are its even elements, the high ones its odd elements,
// interleaved back by two byte permutes per pair.
template <>
struct StageRows<Nvfp4Format> {
  __device__ static void copy(const uint8_t* src, int64_t scale_offset, bf16* dst, int32_t rows, int32_t D) {
    const uint32_t* codes = reinterpret_cast<const uint32_t*>(src);
    const uint8_t* scales = src + scale_offset;  // one per group of 16: chunks 2g, 2g + 1
    uint4* out = reinterpret_cast<uint4*>(dst);
    for_each_chunk(
        rows * D / 8, [&](int32_t i) { return make_uint2(__ldg(codes + i), __ldg(scales + i / 2)); },
        [&](int32_t i, const uint2& c) {
          const uint32_t sc = f16x2_broadcast(Nvfp4Format::scale_pair(c.y), false);
          uint32_t e0, e4, o1, o5;  // elements (0, 2), (4, 6), (1, 3), (5, 7)
          e4m3x4_to_f16x2x2(Nvfp4Format::low_nibbles_e4m3(c.x), e0, e4);
          e4m3x4_to_f16x2x2(Nvfp4Format::high_nibbles_e4m3(c.x), o1, o5);
          out[i] = f16x8_to_bf16x8(hmul2(byte_perm(e0, o1, 0x5410u), sc), hmul2(byte_perm(e0, o1, 0x7632u), sc),
                                   hmul2(byte_perm(e4, o5, 0x5410u), sc), hmul2(byte_perm(e4, o5, 0x7632u), sc));
        });
  }
};

template <class Fmt>
__global__ void __launch_bounds__(kStageThreads) prefill_stage_kernel(const __grid_constant__ PrefillStageParams p) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The prefill kernel may launch now: it reads nothing before its own
  // griddepcontrol.wait, which waits for this grid to finish.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int32_t seq = int32_t(blockIdx.y), slot = int32_t(blockIdx.x);
  const bool is_v = blockIdx.z == 1;
  // The prefill kernel's length, run and attended pages (sequence_run.cuh).
  const int32_t seq_len = clamped_seq_len(p, seq);
  const PageRange span = run_pages(seq_len, query_run(p, seq, seq_len).len, p.sliding_window, p.block_size);
  const int32_t first = span.first, end = span.end;
  int32_t* table = p.table + int64_t(seq) * p.table_stride;
  if (int64_t(seq_len) > int64_t(p.table_stride) * p.block_size || end - first > p.slots) {
    if (is_v) return;
    for (int32_t j = slot * kStageThreads + int32_t(threadIdx.x); j < p.table_stride; j += p.slots * kStageThreads)
      table[j] = -1;
    return;
  }
  const int32_t j = first + slot;
  if (j >= end) return;
  const int32_t id = __ldg(p.block_tables + int64_t(seq) * p.max_blocks_per_seq + j);
  const bool ok = id >= 0 && id < p.num_blocks;
  const int64_t staged = int64_t(seq) * p.slots + slot;
  if (threadIdx.x == 0 && !is_v) table[j] = ok ? int32_t(staged) : -1;
  if (!ok) return;
  // Rows of the page's positions inside the sequence (a partial last page's others are never read).
  const int32_t rows = min(p.block_size, seq_len - j * p.block_size) * p.num_kv_heads;
  const int64_t page = int64_t(id) * p.page_stride;
  StageRows<Fmt>::copy((is_v ? p.v_cache : p.k_cache) + page, p.scale_offset,
                       (is_v ? p.v : p.k) + staged * p.page_elems, rows, p.head_dim);
}

// Where the staged region `s` of `plan` starts in `workspace` (aligned; the
// split-K records come first).
uint8_t* prefill_stage_region(const AttnPlan& plan, const geometry::PrefillStaging& s, void* workspace) {
  const size_t records = plan.workspace_bytes - s.bytes;
  const uintptr_t start = reinterpret_cast<uintptr_t>(workspace) + records;
  constexpr uintptr_t kAlign = geometry::kPrefillStageAlign;
  return reinterpret_cast<uint8_t*>((start + kAlign - 1) / kAlign * kAlign);
}

}  // namespace

PrefillStageParams make_prefill_stage_params(const AttnPlan& plan, const AttnArgs& a, void* workspace) {
  const geometry::PrefillStaging s = geometry::prefill_staging(plan.problem);
  uint8_t* region = prefill_stage_region(plan, s, workspace);
  PrefillStageParams p{};
  fill_paged_inputs(p, a);
  p.num_kv_heads = a.cache.layout.num_kv_heads;
  p.head_dim = a.cache.layout.head_dim;
  p.slots = s.slots;
  p.table_stride = s.table_stride;
  p.table = reinterpret_cast<int32_t*>(region + s.table_offset);
  p.k = reinterpret_cast<bf16*>(region + s.k_offset);
  p.v = reinterpret_cast<bf16*>(region + s.v_offset);
  p.page_elems = s.page_bytes / 2;
  return p;
}

void launch_prefill_stage(const PrefillStageParams& p, KvFormat format, int32_t num_seqs, cudaStream_t stream) {
  const detail::DependentLaunch l(dim3(unsigned(p.slots), unsigned(num_seqs), 2), dim3(kStageThreads), 0, stream);
  switch (format) {
    case KvFormat::fp8_e4m3: return detail::launch_dependent(l, prefill_stage_kernel<Fp8Format>, "prefill_stage<fp8>", p);
    case KvFormat::nvfp4: return detail::launch_dependent(l, prefill_stage_kernel<Nvfp4Format>, "prefill_stage<nvfp4>", p);
    case KvFormat::bf16: break;
  }
  detail::throw_unsupported("format", to_string(format), "fp8_e4m3 or nvfp4 (a staged prefill)");
}

}  // namespace metrale::kernels
