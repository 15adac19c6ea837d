// reshape_and_cache on the GPU (docs/spec.md 1-3): writes each new token's K and
// V rows (bf16; token and head strided: fused QKV rows or head-major views)
// into its slot of the paged K and V caches, as BF16, FP8 E4M3 or NVFP4.
//
// Design (one kernel template over the format policies of kernels/formats/,
// which own the per-format chunk load and quantization; three instantiations):
//  * Work unit = one "chunk": kWriteElems consecutive head_dim elements of one
//    (token, K|V, kv head) row. bf16: 8 elements (16-byte load, 16-byte store);
//    fp8: 16 elements (two 16-byte loads, one 16-byte store); nvfp4: 32
//    elements = two scale groups (four 16-byte loads, one 16-byte store of
//    packed codes, one 2-byte store of the two E4M3 scales; two groups per
//    thread halve the per-chunk index math and give the quantizer two
//    independent chains). A row of head_dim D (64, 128, 256) is D/kWriteElems
//    chunks (2..32 threads); consecutive threads take consecutive
//    chunks of a token's K heads, then its V heads, so loads and stores of a
//    warp are contiguous runs.
//  * A 256-thread block handles a tile of `tokens_per_tile` tokens (chosen on
//    the host so a tile is about one block's worth of chunks); tiles are
//    visited with a grid-stride loop over a capped grid, so any num_tokens
//    (< 2^31) launches within the grid limits. All address math is 64-bit;
//    the item -> (token, chunk) split divides by a multiply-high with a
//    host-computed magic number (exact in the kernel's range, see launch).
//  * A thread issues its chunk's loads together with the slot_mapping load
//    (the source row does not depend on the slot), so the two latencies
//    overlap instead of adding up.
//  * Quantization is bit-identical to the scalar codecs of metrale/codec.hpp
//    (the functions the CPU reference calls), through the faster equivalents
//    of quantize_fast.cuh: fp8 code = e4m3_rne_satfinite(x * inv_scale) with
//    inv_scale computed on the host, the product rounded to f32 and then
//    converted by the hardware cvt.rn.satfinite.e4m3x2 (NaN codes
//    canonicalised); nvfp4 groups through fastq::nvfp4_quantize_groups
//    (packed 16-bit integer amax, hardware E4M3 scale conversions, the
//    codec's IEEE divisions, E2M1 rounding by one magic add per element). No
//    fast-math: the one f32 add (E2M1 rounding) is an explicit __fadd_rn, so
//    no product is contracted into an FMA, and nvcc's default f32 division
//    is IEEE round-to-nearest.
//  * An NVFP4 cache whose layout takes Nvfp4ScaleRule::adaptive quantizes
//    each group twice (absmax mapped to 6 and to 4) and keeps the smaller
//    squared error (fastq::nvfp4_quantize_2groups_adaptive_unit, or _codec
//    for an extreme g; bit-identical to codec::nvfp4_quantize_group_adaptive,
//    kernels/cache/quantize_adaptive.cuh) in its own kernel over the unit
//    route's body, so max6's kernels are untouched and adaptive adds three
//    small instantiations (packed / head-strided heads, extreme g).
//  * A slot < 0 is padding (skipped). A slot >= capacity is skipped and
//    counted: the thread holding a token's first chunk counts it; counts are
//    summed per warp and added with one atomicAdd per warp that saw any.
//  * Saturated elements (codec::fp8_saturates / nvfp4_saturates) of written
//    tokens are counted the same way, K and V apart. A chunk looks at its
//    elements only when one of its codes (FP8) or group scales (NVFP4) is
//    448 or NaN (codec::e4m3_code_may_saturate), reading them again then, so
//    the common chunk pays a test of its codes, no per-element work and no
//    registers held across the store.
//  * A head stride only moves the source address of a (token, head) row:
//    each chunk lies inside one head's D contiguous values, so the loads stay
//    16-byte vectors; the NVFP4 unit route, which indexes a token's heads as
//    one run, splits the chunk index per head only when heads are not packed
//    (a template flag: the packed route's code is unchanged).
#include <cuda_runtime.h>

#include <cstdint>

#include "host/validate.hpp"
#include "kernels/cache/quantize_adaptive.cuh"
#include "kernels/cache/quantize_fast.cuh"
#include "kernels/common/cuda_check.hpp"
#include "kernels/formats/bf16.cuh"
#include "kernels/formats/fp8.cuh"
#include "kernels/formats/nvfp4.cuh"
#include "metrale/codec.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"

namespace metrale::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;  // grid cap; the tile loop covers the rest

struct CacheWriteParams {
  const bf16* key;
  const bf16* value;
  int64_t key_stride;         // elements between tokens
  int64_t value_stride;       // elements between tokens
  int64_t key_head_stride;    // elements between heads (head_dim when packed)
  int64_t value_head_stride;  // elements between heads
  const int64_t* slot_mapping;
  int64_t num_tokens;
  int64_t capacity;  // num_blocks * block_size
  uint8_t* k_cache;
  uint8_t* v_cache;
  int64_t page_stride_bytes;
  int64_t data_section_bytes;
  int32_t* skipped;  // may be null
  unsigned long long* saturated;  // [2] K, V elements; may be null
  float k_param;     // fp8: 1/k_scale; nvfp4: k_global_scale; bf16: unused
  float v_param;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t log2_block_size;
  int32_t log2_chunks_per_row;
  int32_t chunks_per_token;  // 2 * H * D / kWriteElems
  uint32_t cpt_magic;        // ceil(2^32 / chunks_per_token): it / cpt = umulhi(it, cpt_magic)
  int32_t tokens_per_tile;
  // nvfp4 unit route only (Nvfp4UnitKernel): 6.0f * g of K and V, and the
  // bytes of codes and of scales of one token row (H*D/2, H*D/16).
  float k_six_g;
  float v_six_g;
  int32_t row_code_bytes;
  int32_t row_scale_bytes;
};

// A thread's counts: out-of-capacity tokens, saturated K and V elements.
struct WriteCounts {
  int32_t skipped = 0;
  uint32_t k_saturated = 0, v_saturated = 0;
};

// Both kernels' work split: kThreads-thread tiles of tokens_per_tile tokens,
// grid-stride over the tiles, item `it` of a tile = chunk `rem` (0 ..
// chunks_per_token-1) of token `token`. `item(token, rem, counts)` does one
// item; the counts reach p.skipped and p.saturated (formats that can
// saturate: kSaturates) once per warp.
template <bool kSaturates, class Item>
__device__ __forceinline__ void for_each_chunk(const CacheWriteParams& p, Item item) {
  const int32_t cpt = p.chunks_per_token;
  const int64_t num_tiles = (p.num_tokens + p.tokens_per_tile - 1) / p.tokens_per_tile;
  WriteCounts counts;
  for (int64_t tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
    const int64_t tok0 = tile * p.tokens_per_tile;
    const int64_t left = p.num_tokens - tok0;
    const int32_t ntok = left < p.tokens_per_tile ? int32_t(left) : p.tokens_per_tile;
    const int32_t items = ntok * cpt;
    for (int32_t it = threadIdx.x; it < items; it += kThreads) {
      const int32_t lt = int32_t(__umulhi(uint32_t(it), p.cpt_magic));
      const int32_t rem = it - lt * cpt;
      const int64_t token = tok0 + lt;
      item(token, rem, counts);
    }
  }
  const bool lane0 = (threadIdx.x & 31) == 0;
  if (p.skipped != nullptr) {
    const int32_t warp_total = __reduce_add_sync(0xffffffffu, counts.skipped);
    if (warp_total != 0 && lane0) atomicAdd(p.skipped, warp_total);
  }
  if (kSaturates && p.saturated != nullptr) {
    // A warp's elements: at most 32 threads' items, far below 2^32.
    const uint32_t k = __reduce_add_sync(0xffffffffu, counts.k_saturated);
    const uint32_t v = __reduce_add_sync(0xffffffffu, counts.v_saturated);
    if (k != 0 && lane0) atomicAdd(p.saturated, (unsigned long long)k);
    if (v != 0 && lane0) atomicAdd(p.saturated + 1, (unsigned long long)v);
  }
}

// Whether `slot` is written: not for padding (< 0), nor past the capacity,
// which counts the token once (at its chunk 0) as skipped.
__device__ __forceinline__ bool slot_in_cache(const CacheWriteParams& p, int64_t slot, int32_t rem,
                                              WriteCounts& counts) {
  if (slot < 0) return false;
  if (slot >= p.capacity) {
    counts.skipped += (rem == 0);
    return false;
  }
  return true;
}

template <class P>
__global__ void __launch_bounds__(kThreads) reshape_and_cache_kernel(const __grid_constant__ CacheWriteParams p) {
  const int32_t H = p.num_kv_heads;
  const int32_t cpr_mask = (1 << p.log2_chunks_per_row) - 1;
  for_each_chunk<P::kSaturates>(p, [&](int64_t token, int32_t rem, WriteCounts& counts) {
    const int32_t r = rem >> p.log2_chunks_per_row;  // 0..2H-1: K heads then V heads
    const int32_t chunk = rem & cpr_mask;
    const bool is_v = r >= H;
    const int32_t h = is_v ? r - H : r;
    const bf16* src = is_v ? p.value + token * p.value_stride : p.key + token * p.key_stride;
    src += int64_t(h) * (is_v ? p.value_head_stride : p.key_head_stride) + int64_t(chunk) * P::kWriteElems;
    // The source row does not depend on the slot: issue its loads together
    // with the slot's so the two latencies overlap (a padding token's row
    // is read for nothing, but it lies inside the key/value input).
    const typename P::WriteChunk raw = P::load_chunk(src);
    const int64_t slot = __ldg(p.slot_mapping + token);
    if (!slot_in_cache(p, slot, rem, counts)) return;
    const int64_t block = slot >> p.log2_block_size;
    const int64_t offset = slot & ((int64_t(1) << p.log2_block_size) - 1);
    uint8_t* page = (is_v ? p.v_cache : p.k_cache) + block * p.page_stride_bytes;
    const int64_t row = offset * H + h;  // (t*H + h) within the page
    const float param = is_v ? p.v_param : p.k_param;
    const uint32_t may = P::store_chunk(raw, page, row, chunk, p.head_dim, p.data_section_bytes, param);
    if (P::kSaturates && may != 0u) (is_v ? counts.v_saturated : counts.k_saturated) += P::chunk_saturated(src, may, param);
  });
}

// 16 bytes from the read-only path, as an asm volatile so that NVVM keeps it
// ahead of the slot load. (That alone does not stop ptxas from sinking it
// below a branch on the slot, as happens to __ldg in
// reshape_and_cache_kernel, whose slot and row latencies add up: see the
// caller.) A padding token's row is read for nothing, but it lies inside the
// key/value input.
__device__ __forceinline__ uint4 ldg_nc_v4_early(const void* ptr) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr));
  return r;
}

// The NVFP4 unit route's quantizers: max6 (fastq::nvfp4_quantize_2groups_unit)
// for global scales that pass fastq::nvfp4_unit_route_ok, adaptive
// (fastq::nvfp4_quantize_2groups_adaptive_unit) for those that pass
// fastq::nvfp4_adaptive_route_ok; adaptive through the codec
// (fastq::nvfp4_quantize_2groups_adaptive_codec) for the others.
enum class UnitQuant { max6, adaptive, adaptive_codec };

// The NVFP4 write for global scales that pass fastq::nvfp4_unit_route_ok
// (every ordinary g; the host checks K's and V's once per launch, otherwise
// max6 takes reshape_and_cache_kernel<Nvfp4Format> and adaptive
// UnitQuant::adaptive_codec). Same work split
// (for_each_chunk, 32-element chunks), with the chunk index taken over a
// token's whole K (or V) row: heads are contiguous in the input
// row and in the page (row (t*H + h) * D/2 bytes of codes, D/16 of scales),
// so chunk c of token row t is src + 32c -> codes t*(H*D/2) + 16c, scales
// t*(H*D/16) + 2c, with no head/chunk split; offsets inside a page fit 32
// bits (block_size <= 128, H*D/2 <= 2^17). kPackedHeads: the input's heads
// are packed too (head stride D), so the source is src + 32c; otherwise
// chunk c is chunk c % (D/32) of head c / (D/32) there.
template <bool kPackedHeads, UnitQuant kQuant>
__device__ __forceinline__ void nvfp4_unit_write(const CacheWriteParams& p) {
  const int32_t cpr = p.chunks_per_token >> 1;  // chunks of one K (or V) token row
  const int32_t offset_mask = (1 << p.log2_block_size) - 1;
  for_each_chunk<true>(p, [&](int64_t token, int32_t rem, WriteCounts& counts) {
    const bool is_v = rem >= cpr;
    const int32_t c = is_v ? rem - cpr : rem;
    const bf16* base = is_v ? p.value : p.key;  // select, then one 64-bit multiply-add
    const int64_t stride = is_v ? p.value_stride : p.key_stride;
    const bf16* src;
    if (kPackedHeads) {
      src = base + (token * stride + c * 32);
    } else {
      const int64_t head = c >> p.log2_chunks_per_row, in_head = c & ((1 << p.log2_chunks_per_row) - 1);
      src = base + (token * stride + head * (is_v ? p.value_head_stride : p.key_head_stride) + in_head * 32);
    }
    const uint4 r0 = ldg_nc_v4_early(src), r1 = ldg_nc_v4_early(src + 8), r2 = ldg_nc_v4_early(src + 16),
                r3 = ldg_nc_v4_early(src + 24);
    const int64_t slot = __ldg(p.slot_mapping + token);
    // Quantize before looking at the slot (a padding or skipped token's
    // codes are computed for nothing): a branch on the slot ahead of the
    // code would let ptxas sink the row loads below it.
    const uint32_t w[16] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w,
                            r2.x, r2.y, r2.z, r2.w, r3.x, r3.y, r3.z, r3.w};
    uint32_t packed[4];
    uint8_t s[2];
    uint8_t six[2];  // adaptive's max6 codes (below)
    if (kQuant == UnitQuant::max6)
      fastq::nvfp4_quantize_2groups_unit(w, is_v ? p.v_six_g : p.k_six_g, is_v ? p.v_param : p.k_param, packed, s);
    else if (kQuant == UnitQuant::adaptive)
      fastq::nvfp4_quantize_2groups_adaptive_unit(w, is_v ? p.v_param : p.k_param, packed, s, six);
    else
      fastq::nvfp4_quantize_2groups_adaptive_codec(w, is_v ? p.v_param : p.k_param, packed, s);
    if (!slot_in_cache(p, slot, rem, counts)) return;
    const int64_t block = slot >> p.log2_block_size;
    const int32_t offset = int32_t(slot) & offset_mask;
    uint8_t* page = (is_v ? p.v_cache : p.k_cache) + block * p.page_stride_bytes;
    *reinterpret_cast<uint4*>(page + (offset * p.row_code_bytes + c * 16)) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
    *reinterpret_cast<uint16_t*>(page + p.data_section_bytes + (offset * p.row_scale_bytes + c * 2)) =
        uint16_t(s[0] | (s[1] << 8));
    // Whether the chunk may hold saturated elements, from max6's codes: an
    // element saturates only where its group's s6 is 448 or NaN. Adaptive's
    // chosen code is 448 wherever s4 is (every group above 0.64 of the
    // calibrated absmax whose 4-candidate wins), and filtering on it had sent
    // most warps of model-like rows through chunk_saturated. The rare codec
    // route filters on the chosen codes (a superset: s6 = 448 makes s4 = s6).
    const uint32_t may = kernels::Nvfp4Format::may_saturate(kQuant == UnitQuant::adaptive ? six : s);
    if (may != 0u)
      (is_v ? counts.v_saturated : counts.k_saturated) +=
          kernels::Nvfp4Format::chunk_saturated(src, may, is_v ? p.v_param : p.k_param);
  });
}

template <bool kPackedHeads>
__global__ void __launch_bounds__(kThreads) nvfp4_unit_kernel(const __grid_constant__ CacheWriteParams p) {
  nvfp4_unit_write<kPackedHeads, UnitQuant::max6>(p);
}

// Adaptive's two encodings per group hold more values live: the unit
// route's at most 64 registers (4 blocks of 256 threads per SM, against
// max6's 5; without the bound ptxas takes 79). The rare codec route keeps
// the default bound, under which its f32 copy of the groups does not spill.
template <bool kPackedHeads, UnitQuant kQuant>
__global__ void __launch_bounds__(kThreads, kQuant == UnitQuant::adaptive ? 4 : 1)
    nvfp4_adaptive_kernel(const __grid_constant__ CacheWriteParams p) {
  nvfp4_unit_write<kPackedHeads, kQuant>(p);
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// Launches the write of format policy P (kernels/formats/), by default its
// reshape_and_cache_kernel.
template <class P>
void launch(CacheWriteParams p, const KvScales& scales, cudaStream_t stream, const char* name,
            void (*kernel)(const CacheWriteParams) = reshape_and_cache_kernel<P>) {
  p.k_param = P::write_param(P::kDesc.k_scale(scales));
  p.v_param = P::write_param(P::kDesc.v_scale(scales));
  const int32_t cpr = p.head_dim / P::kWriteElems;
  p.log2_chunks_per_row = log2_exact(cpr);
  p.chunks_per_token = 2 * p.num_kv_heads * cpr;  // <= 2 * 1024 * 32
  p.tokens_per_tile = p.chunks_per_token >= kThreads ? 1 : kThreads / p.chunks_per_token;
  // Exact division by multiply-high: with d = cpt >= 2 and m = ceil(2^32/d)
  // = (2^32 + e)/d, 0 <= e < d, umulhi(n, m) = floor(n/d + n*e/(d*2^32)) =
  // n/d rounded down whenever n*e < 2^32. The kernel's n < items <=
  // max(d, kThreads) and d <= 65536, so n*e < 2^32 always.
  p.cpt_magic = uint32_t(((uint64_t(1) << 32) + uint64_t(p.chunks_per_token) - 1) / uint64_t(p.chunks_per_token));
  const int64_t tiles = (p.num_tokens + p.tokens_per_tile - 1) / p.tokens_per_tile;
  const int64_t grid = tiles < kMaxBlocks ? tiles : kMaxBlocks;
  kernel<<<dim3(uint32_t(grid)), dim3(kThreads), 0, stream>>>(p);
  detail::check_launch(name);
}

}  // namespace

void reshape_and_cache(const CacheWriteArgs& args, Stream stream) {
  // Validation is pure host code and precedes any CUDA runtime call.
  detail::validate_cache_write(args);
  if (args.num_tokens == 0) return;

  const KvCacheLayout& l = args.cache.layout;
  CacheWriteParams p{};
  p.key = args.key;
  p.value = args.value;
  p.key_stride = args.key_stride;
  p.value_stride = args.value_stride;
  p.key_head_stride = args.key_head_stride_used();
  p.value_head_stride = args.value_head_stride_used();
  p.slot_mapping = args.slot_mapping;
  p.num_tokens = args.num_tokens;
  p.capacity = l.capacity_slots();
  p.k_cache = static_cast<uint8_t*>(args.cache.k);
  p.v_cache = static_cast<uint8_t*>(args.cache.v);
  p.page_stride_bytes = l.page_stride_bytes;
  p.data_section_bytes = l.data_section_bytes;
  p.skipped = args.skipped;
  p.saturated = reinterpret_cast<unsigned long long*>(args.saturated);  // same bytes, two's complement
  p.num_kv_heads = l.num_kv_heads;
  p.head_dim = l.head_dim;
  p.log2_block_size = log2_exact(l.block_size);  // block sizes are powers of two (validated)

  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const KvScales& sc = args.cache.scales;
  // The one dispatch from the runtime format to its policy.
  switch (l.format) {
    case KvFormat::bf16: return launch<kernels::Bf16Format>(p, sc, s, "reshape_and_cache<bf16>");
    case KvFormat::fp8_e4m3: return launch<kernels::Fp8Format>(p, sc, s, "reshape_and_cache<fp8>");
    case KvFormat::nvfp4: {
      const bool adaptive = l.nvfp4_scales == Nvfp4ScaleRule::adaptive;
      const bool unit = fastq::nvfp4_unit_route_ok(sc.k_global_scale) && fastq::nvfp4_unit_route_ok(sc.v_global_scale);
      if (!adaptive && !unit)
        return launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4, extreme global scale>");
      p.k_six_g = 6.0f * sc.k_global_scale;  // the codec's f32 product
      p.v_six_g = 6.0f * sc.v_global_scale;
      p.row_code_bytes = p.num_kv_heads * int32_t(kernels::Nvfp4Format::kDesc.row_code_bytes(p.head_dim));
      p.row_scale_bytes = p.num_kv_heads * int32_t(kernels::Nvfp4Format::kDesc.row_scale_bytes(p.head_dim));
      const bool packed = p.key_head_stride == p.head_dim && p.value_head_stride == p.head_dim;
      using Q = UnitQuant;
      if (!adaptive)
        return packed ? launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4>", nvfp4_unit_kernel<true>)
                      : launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4, head-strided>",
                                                     nvfp4_unit_kernel<false>);
      // Adaptive's unit route also needs its branch-free reciprocal's range.
      if (!(fastq::nvfp4_adaptive_route_ok(sc.k_global_scale) && fastq::nvfp4_adaptive_route_ok(sc.v_global_scale)))
        // the head-strided indexing serves packed heads too
        return launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4, adaptive, extreme global scale>",
                                            nvfp4_adaptive_kernel<false, Q::adaptive_codec>);
      return packed ? launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4, adaptive>",
                                                   nvfp4_adaptive_kernel<true, Q::adaptive>)
                    : launch<kernels::Nvfp4Format>(p, sc, s, "reshape_and_cache<nvfp4, adaptive, head-strided>",
                                                   nvfp4_adaptive_kernel<false, Q::adaptive>);
    }
  }
}

}  // namespace metrale::cuda
