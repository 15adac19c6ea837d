"""metrale: paged KV-cache attention (BF16, FP8 E4M3, NVFP4 caches).

Python bindings of the metrale C++/CUDA library. Every operation takes
arrays through DLPack, ``__cuda_array_interface__`` or the buffer protocol
(torch, CuPy, JAX, Numba, NumPy), without copies:
arrays in host memory run on the CPU reference backend, CUDA arrays on the
CUDA backend (Hopper, sm_90a), enqueued on the caller's current stream.

Conventions
-----------
* **bf16 data**: ``torch.bfloat16`` tensors, or -- NumPy has no bfloat16 --
  ``uint16`` arrays holding bf16 bit patterns (``to_bf16`` / ``from_bf16``
  convert float32 <-> those patterns). uint16 is accepted on GPU too.
* **Streams**: CUDA work runs on ``stream=`` when given (an int handle, a
  ``torch.cuda.Stream`` or a CuPy stream); else, for torch tensors, on
  ``torch.cuda.current_stream()``; for CuPy arrays on CuPy's current stream;
  otherwise on the legacy default stream. torch is never imported by the
  attention path: the stream is looked up only when the arrays are torch
  tensors. ``Planner.run`` neither synchronises nor allocates (given an
  ``out``; the planner owns the split-K workspace), so a step can be
  captured in a ``torch.cuda.CUDAGraph``; ``metrale.attention`` plans the
  call's batch itself (host work) and may allocate.
* **Errors**: bad arguments raise ``ValueError`` (wrong shape, strides,
  alignment, device, GQA ratio, workspace size, unsupported head_dim /
  block_size, a forced plan the target cannot run or whose workspace passes
  the bound) or ``TypeError`` (wrong dtype, not an array), naming the
  argument and what was expected, before anything is allocated or launched;
  CUDA runtime failures raise ``CudaError``.

Submodules imported on demand (they need torch): ``metrale.torch_ops`` (the cache
write and attention as ``torch.ops.metrale.*`` for torch.compile and CUDA graphs) and
``metrale.transformers`` (a paged cache and ``attn_implementation="metrale"``
for Hugging Face transformers 5.x; docs/engines.md).

Quick tour::

    import numpy as np, metrale
    cache = metrale.PagedKVCache("fp8", num_blocks=64, block_size=16,
                                 num_kv_heads=8, head_dim=128, num_layers=2)
    cache.calibrate(key, value)                  # per-tensor FP8 scales
    cache.write(0, key, value, slot_mapping)     # reshape_and_cache
    out = metrale.attention(q, cache.layer(0), block_tables, seq_lens)   # decode
    out, lse = metrale.attention(q, cache.layer(0), block_tables, seq_lens,
                                 q_start=q_start, sinks=sinks, return_lse=True)  # query runs
    plan = metrale.Planner(num_seqs, 32, cache, max_seq_len)  # once per batch shape, on the cache's device
    out = plan.run(q, cache.layer(0), block_tables, seq_lens)
"""

from ._arrays import MAX_SPLITS, SUPPORTED_HEAD_DIMS, from_bf16, make_layout, to_bf16
from ._metrale import AttnPlan, BlockAllocator, CudaError, KvCacheLayout, KvFormat
from .attention import attention, reduce_states
from .cache import Calibrator, PagedKVCache, kv_scales_from_absmax
from .ops import (bf16_absmax, cpu_num_threads, cuda_available, fp8_scale_from_absmax, nvfp4_global_scale_from_absmax,
                  reshape_and_cache, set_cpu_num_threads, splitk_workspace_bytes, validate_block_tables)
from .planner import Planner
from .view import KVCacheView

__all__ = [
    "CudaError",
    "attention",
    "reduce_states",
    "AttnPlan",
    "BlockAllocator",
    "KvCacheLayout",
    "KvFormat",
    "KVCacheView",
    "PagedKVCache",
    "Planner",
    "Calibrator",
    "reshape_and_cache",
    "bf16_absmax",
    "fp8_scale_from_absmax",
    "nvfp4_global_scale_from_absmax",
    "kv_scales_from_absmax",
    "make_layout",
    "splitk_workspace_bytes",
    "validate_block_tables",
    "cuda_available",
    "cpu_num_threads",
    "set_cpu_num_threads",
    "to_bf16",
    "from_bf16",
    "MAX_SPLITS",
    "SUPPORTED_HEAD_DIMS",
]

__version__ = "0.1.0"
