// Host side of the CUDA decode: validation, DecodeArgs -> DecodeParams, the
// one dispatch point over formats, and run_decode (plan -> launches).
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "kernels/decode/decode_launch.cuh"
#include "kernels/decode/kv_tensor_map.hpp"
#include "metrale/cuda.hpp"

namespace metrale::cuda {
namespace {

using kernels::DecodeParams;

int32_t num_sms() {
  int dev = 0, sms = 0;
  detail::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  return sms;
}

DecodeParams make_params(const DecodeArgs& a) {
  const KvCacheLayout& L = a.cache.layout;
  // The kernel addresses bytes inside a page with 32-bit offsets (the NVFP4
  // scale section starts data_section_bytes in, which the layout leaves open).
  METRALE_CHECK_ARG(L.data_section_bytes < (int64_t(1) << 30), "layout.data_section_bytes", L.data_section_bytes,
                    "< 2^30 on the CUDA backend (32-bit offsets inside a page)");
  DecodeParams p{};
  p.q = a.q;
  p.q_stride = a.q_stride;
  p.k_cache = static_cast<const uint8_t*>(a.cache.k);
  p.v_cache = static_cast<const uint8_t*>(a.cache.v);
  p.page_stride = L.page_stride_bytes;
  p.scale_offset = L.data_section_bytes;
  p.num_blocks = int32_t(L.num_blocks);
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.seq_lens = a.seq_lens;
  p.num_q_heads = a.num_q_heads;
  p.num_kv_heads = L.num_kv_heads;
  p.group = a.num_q_heads / L.num_kv_heads;
  // (the SM count is asked only where the rule can pair)
  p.pair_kv_heads = L.head_dim == 64 &&
                    kernels::decode_pairs_kv_heads(L.head_dim, p.num_kv_heads, p.group, a.num_seqs, num_sms());
  if (p.pair_kv_heads) {
    p.num_kv_heads /= 2;
    p.group *= 2;
  }
  p.head_tiles = (p.group + kernels::kDecodeQHeadsPerCta - 1) / kernels::kDecodeQHeadsPerCta;
  p.block_size = L.block_size;
  p.sliding_window = a.sliding_window;
  float k_factor = 1.0f, v_factor = 1.0f;
  if (L.format == KvFormat::fp8_e4m3) {
    k_factor = a.cache.scales.k_scale;
    v_factor = a.cache.scales.v_scale;
  } else if (L.format == KvFormat::nvfp4) {
    k_factor = a.cache.scales.k_global_scale * kernels::Nvfp4Format::kOperandFactor;
    v_factor = a.cache.scales.v_global_scale * kernels::Nvfp4Format::kOperandFactor;
  }
  constexpr float kLog2e = 1.4426950408889634f;
  p.qk_log2_scale = a.sm_scale * kLog2e * k_factor;
  p.v_factor = v_factor;
  p.num_splits = 1;
  p.cluster_merge = 0;
  p.out = a.out;
  // bf16 and fp8 take the TMA kernel wherever the driver encodes the maps
  // (any valid layout: 16-byte aligned bases and page strides);
  // METRALE_DECODE_NO_TMA=1 keeps them on the register-path kernel (the
  // tests cover both; A/B measurements).
  const char* no_tma = std::getenv("METRALE_DECODE_NO_TMA");
  // Paired heads: the maps see a row of head_dim 128 per head pair, so one
  // 128-byte box spans both heads' rows (decode_kernel.cuh, k_vector).
  KvCacheLayout map_layout = L;
  if (p.pair_kv_heads) {
    map_layout.head_dim *= 2;
    map_layout.num_kv_heads /= 2;
  }
  p.use_tma = L.format != KvFormat::nvfp4 && !(no_tma != nullptr && no_tma[0] == '1') &&
              kernels::make_kv_tensor_map(p.k_map, a.cache.k, map_layout) &&
              kernels::make_kv_tensor_map(p.v_map, a.cache.v, map_layout);
  return p;
}

int64_t num_ctas(const DecodeParams& p, int32_t num_seqs) {
  const int64_t n = int64_t(num_seqs) * p.num_kv_heads * p.head_tiles;  // kv heads of the CTAs (pairs at head_dim 64)
  METRALE_CHECK_ARG(n <= detail::kMaxGridX, "num_seqs", num_seqs,
                    "num_seqs * num_kv_heads * ceil(group/8) <= 2^31-1 (grid limit)");
  return n;
}

// Whether the output is complete (single pass, or split-K merged in-kernel).
bool launch(const DecodeParams& p, KvFormat format, int head_dim, int64_t ctas, Stream stream) {
  switch (format) {
    case KvFormat::bf16: return kernels::launch_decode_bf16(p, head_dim, ctas, stream);
    case KvFormat::fp8_e4m3: return kernels::launch_decode_fp8(p, head_dim, ctas, stream);
    case KvFormat::nvfp4: return kernels::launch_decode_nvfp4(p, head_dim, ctas, stream);
  }
  detail::throw_unsupported("format", int(format), "bf16, fp8_e4m3, nvfp4");
}

// The split pass of validated `args` into the workspace `ws`, or, with
// `cluster_merge`, merged in-kernel by clusters of the splits where they fit
// the GPU. Returns whether the output is complete (no reduce needed).
bool launch_split_pass(const DecodeArgs& args, const SplitKWorkspace& ws, bool cluster_merge, Stream stream) {
  detail::validate_workspace(args, ws);
  if (args.num_seqs == 0) return true;
  DecodeParams p = make_params(args);
  p.num_splits = ws.num_splits;
  p.workspace = ws.data;
  p.cluster_merge = cluster_merge;
  if (!cluster_merge) p.out = nullptr;  // the split pass writes only the workspace
  return launch(p, args.cache.layout.format, args.cache.layout.head_dim, num_ctas(p, args.num_seqs), stream);
}

}  // namespace

void paged_decode_attn(const DecodeArgs& args, Stream stream) {
  detail::validate_decode(args);
  if (args.num_seqs == 0) return;
  DecodeParams p = make_params(args);
  launch(p, args.cache.layout.format, args.cache.layout.head_dim, num_ctas(p, args.num_seqs), stream);
}

void paged_decode_attn_splitk(const DecodeArgs& args, const SplitKWorkspace& ws, Stream stream) {
  detail::validate_decode(args, /*writes_out=*/false);
  launch_split_pass(args, ws, /*cluster_merge=*/false, stream);
}

// As cpu::run_decode: the plan's num_splits is authoritative, ws supplies
// the memory. 2-8 splits merge inside clusters of the split CTAs where all
// the grid's clusters can be resident at once (decode_launch.cuh); the
// workspace and the reduce serve more splits and the other grids.
void run_decode(const DecodePlan& plan, const DecodeArgs& args, const SplitKWorkspace& ws, Stream stream) {
  detail::validate_plan(plan);
  detail::validate_decode(args);  // everything, `out` included, before any launch
  if (plan.num_splits == 1) return paged_decode_attn(args, stream);
  SplitKWorkspace w = ws;
  w.num_splits = plan.num_splits;
  if (launch_split_pass(args, w, plan.num_splits <= kernels::kMaxClusterSplits, stream)) return;
  paged_decode_attn_reduce(reduce_args_for(args, w), stream);
}

}  // namespace metrale::cuda
