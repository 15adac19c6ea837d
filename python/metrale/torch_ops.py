"""PyTorch custom operators over metrale (``torch.library``): the cache write and attention
as ``torch.ops.metrale.*``, with fake (meta) implementations, so that
``torch.compile(fullgraph=True)`` traces a step without a graph break and a CUDA graph
captures it (the ops enqueue on the current stream and never synchronise).

Operators (importing this module registers them; needs torch >= 2.4):

* ``metrale::reshape_and_cache(key, value, slot_mapping, k_cache, v_cache, format,
  block_size, num_kv_heads, k_scale, v_scale, data_section_bytes=0)`` mutates ``k_cache`` /
  ``v_cache``; ``metrale::reshape_and_cache_counted(..., saturated)`` also adds the clipped
  K and V elements to ``saturated`` (int64 ``[2]`` on the cache's device);
* ``metrale::attention(q, k_cache, v_cache, block_tables, seq_lens, format, block_size,
  num_kv_heads, k_scale=1.0, v_scale=1.0, q_start=None, max_q_len=0, max_seq_len=0,
  sliding_window=0, sm_scale=None, sinks=None, softcap=0.0, return_lse=False,
  data_section_bytes=0) -> (out, lse)``: every query shape (``q_start`` None: decode, one
  row per sequence), out ``(rows, num_q_heads, head_dim)`` bf16, lse float32
  ``(rows, num_q_heads)`` when ``return_lse`` (else an empty ``(0,)`` tensor).

A cache enters an operator as its two uint8 page buffers ``(num_blocks, page_stride_bytes)``
(``PagedKVCache.k(i)`` / ``.v(i)``) plus its format ("bf16", "fp8", "nvfp4"), block_size,
num_kv_heads and the format's two per-tensor scales (FP8 ``k_scale`` / ``v_scale``; NVFP4
the global scales; BF16 ignores them): plain values torch.compile specialises on (scales are
fixed once a layer holds tokens). head_dim is q's (key's) last dimension. q may be any
``(rows, heads, head_dim)`` view with a unit inner stride (transformers' batch-1 query
``(1, heads, tokens, D)`` transposed to ``(tokens, heads, D)``), or ``(batch, heads, 1, D)``.
``max_seq_len`` sizes the plan (0: the longest of a host seq_lens, else the block table's
capacity; any length up to the capacity runs on it: it only tunes the split count). The
attention operator makes its plan once per shape (an LRU of the most recently used plans,
:class:`_PlanCache`) and allocates only its outputs and, where the plan merges through one,
its split-K workspace, through torch's allocator (graph-safe).
"""

from __future__ import annotations

import atexit
import collections
from typing import Any, Optional, Tuple

import torch

from . import _metrale
from ._arrays import _dl, make_layout
from .planner import _q_shape
from .view import scales_of


class _PlanCache:
    """The plans of the last `capacity` shapes used, dropped least-recently used first."""

    def __init__(self, capacity: int = 64):
        self.capacity = int(capacity)
        self._plans: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()

    def get(self, key: tuple, make):
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = make()
        self._plans[key] = plan
        if len(self._plans) > self.capacity:
            self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key: tuple) -> bool:
        return key in self._plans

    def clear(self) -> None:
        self._plans.clear()


_PLANS = _PlanCache()
_LAYOUTS = _PlanCache(capacity=64)


@atexit.register
def _release() -> None:
    """torch's operator registry keeps this module alive past the extension's teardown: drop the
    bound objects first (else nanobind reports them as leaked)."""
    _PLANS.clear()
    _LAYOUTS.clear()


def _layout(format: str, k_cache: torch.Tensor, block_size: int, num_kv_heads: int, head_dim: int,
            data_section_bytes: int, nvfp4_scales: str = "max6"):
    """The KvCacheLayout of a cache given as its (num_blocks, page_stride_bytes) page buffer."""
    if k_cache.dim() != 2:
        raise ValueError(f"'k_cache': shape {tuple(k_cache.shape)}; expected the 2-D page buffer "
                         "(num_blocks, page_stride_bytes) (PagedKVCache.k(layer))")
    num_blocks, page_bytes = int(k_cache.shape[0]), int(k_cache.shape[1]) * k_cache.element_size()
    key = (str(format), num_blocks, page_bytes, int(block_size), int(num_kv_heads), int(head_dim),
           int(data_section_bytes), str(nvfp4_scales))

    def make():
        fmt = str(format).lower()
        lay = make_layout(fmt, num_blocks, int(block_size), int(num_kv_heads), int(head_dim),
                          nvfp4_scales=str(nvfp4_scales))
        if int(lay.page_stride_bytes) != page_bytes or data_section_bytes:  # padded pages
            if fmt in ("bf16", "bfloat16"):
                raise ValueError(f"'k_cache': pages of {page_bytes} bytes; a bf16 layout's are "
                                 f"{int(lay.page_stride_bytes)} (dense)")
            lay = make_layout(fmt, num_blocks, int(block_size), int(num_kv_heads), int(head_dim),
                              cache_stride=page_bytes, block_stride_bytes=page_bytes,
                              data_section_bytes=int(data_section_bytes), nvfp4_scales=str(nvfp4_scales))
        return lay

    return _LAYOUTS.get(key, make)


def _stream(t: torch.Tensor) -> int:
    return int(torch.cuda.current_stream(t.device).cuda_stream) if t.is_cuda else 0


def _kv_heads_dim(key: torch.Tensor, num_kv_heads: int) -> int:
    if key.dim() == 2:
        if key.shape[1] % num_kv_heads:
            raise ValueError(f"'key': shape {tuple(key.shape)}; expected (tokens, num_kv_heads * head_dim) with "
                             f"num_kv_heads = {num_kv_heads}")
        return int(key.shape[1]) // int(num_kv_heads)
    return int(key.shape[-1])


def _write(key, value, slot_mapping, k_cache, v_cache, format, block_size, num_kv_heads, k_scale, v_scale,
           data_section_bytes, nvfp4_scales, saturated) -> None:
    lay = _layout(format, k_cache, block_size, num_kv_heads, _kv_heads_dim(key, num_kv_heads), data_section_bytes,
                  nvfp4_scales)
    _metrale.reshape_and_cache(_dl(key), _dl(value), _dl(slot_mapping), lay, _dl(k_cache), _dl(v_cache),
                               scales_of(lay.format, k_scale, v_scale), None,
                               None if saturated is None else _dl(saturated), _stream(key))


# Two operators, not one with `saturated: Optional[Tensor] = None`: torch 2.11's
# ADInplaceOrView kernel of a custom op indexes the positional arguments by the
# schema's mutated indices, so a mutated argument left to its default raised
# IndexError (torch 2.15 checks the bound).
@torch.library.custom_op("metrale::reshape_and_cache", mutates_args=("k_cache", "v_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, format: str, block_size: int, num_kv_heads: int, k_scale: float,
                      v_scale: float, data_section_bytes: int = 0, nvfp4_scales: str = "max6") -> None:
    """metrale.reshape_and_cache as an operator (negative slots are padding; slots past the
    capacity are skipped): key / value read where they lie (token and head strides);
    ``nvfp4_scales`` is the NVFP4 group-scale rule ("max6" | "adaptive")."""
    _write(key, value, slot_mapping, k_cache, v_cache, format, block_size, num_kv_heads, k_scale, v_scale,
           data_section_bytes, nvfp4_scales, None)


@reshape_and_cache.register_fake
def _(key, value, slot_mapping, k_cache, v_cache, format, block_size, num_kv_heads, k_scale, v_scale,
      data_section_bytes=0, nvfp4_scales="max6") -> None:
    return None


@torch.library.custom_op("metrale::reshape_and_cache_counted", mutates_args=("k_cache", "v_cache", "saturated"))
def reshape_and_cache_counted(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
                              k_cache: torch.Tensor, v_cache: torch.Tensor, format: str, block_size: int,
                              num_kv_heads: int, k_scale: float, v_scale: float, saturated: torch.Tensor,
                              data_section_bytes: int = 0, nvfp4_scales: str = "max6") -> None:
    """reshape_and_cache that also adds the write's clipped K and V elements to ``saturated``'s
    two int64 counters (no synchronisation)."""
    _write(key, value, slot_mapping, k_cache, v_cache, format, block_size, num_kv_heads, k_scale, v_scale,
           data_section_bytes, nvfp4_scales, saturated)


@reshape_and_cache_counted.register_fake
def _(key, value, slot_mapping, k_cache, v_cache, format, block_size, num_kv_heads, k_scale, v_scale, saturated,
      data_section_bytes=0, nvfp4_scales="max6") -> None:
    return None


def _check_q(q: torch.Tensor) -> Tuple[int, int, int]:
    """(rows, q heads, head_dim) of the operator's q (3-D or 4-D: head_dim is its last dimension)."""
    if q.dim() not in (3, 4):
        raise ValueError(f"'q': shape {tuple(q.shape)}; expected (rows, num_q_heads, head_dim) (any row and head "
                         "strides, unit inner stride), (batch, heads, 1, head_dim) or (1, heads, rows, head_dim)")
    d = int(q.shape[-1])
    rows, hq = _q_shape(q, d, None)
    return rows, hq, d


def _plan(q: torch.Tensor, lay, num_seqs: int, num_q_heads: int, max_seq_len: int, window: int, max_q_len: int,
          rows: int, query_runs: bool, options: bool):
    index = -1 if q.device.type == "cpu" else (q.device.index if q.device.index is not None
                                               else torch.cuda.current_device())
    layout_key = (lay.format, int(lay.num_blocks), int(lay.block_size), int(lay.num_kv_heads), int(lay.head_dim),
                  int(lay.page_stride_bytes), int(lay.data_section_bytes))
    key = (index, num_seqs, num_q_heads, layout_key, max_seq_len, window, max_q_len, rows, query_runs, options)
    return _PLANS.get(key, lambda: _metrale.plan_attention(num_seqs, num_q_heads, lay, max_seq_len, window, index,
                                                           max_q_len, rows, options, query_runs, 0, "automatic", 0))


@torch.library.custom_op("metrale::attention", mutates_args=())
def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, format: str, block_size: int, num_kv_heads: int, k_scale: float = 1.0,
              v_scale: float = 1.0, q_start: Optional[torch.Tensor] = None, max_q_len: int = 0,
              max_seq_len: int = 0, sliding_window: int = 0, sm_scale: Optional[float] = None,
              sinks: Optional[torch.Tensor] = None, softcap: float = 0.0, return_lse: bool = False,
              data_section_bytes: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention over the paged cache for every query shape (module docstring): returns
    (out, lse), lse empty unless ``return_lse``."""
    rows, hq, d = _check_q(q)
    lay = _layout(format, k_cache, block_size, num_kv_heads, d, data_section_bytes)
    if block_tables.dim() != 2:
        raise ValueError(f"'block_tables': shape {tuple(block_tables.shape)}; expected (num_seqs, "
                         "max_blocks_per_seq)")
    capacity = int(block_tables.shape[1]) * int(block_size)
    num_seqs = int(block_tables.shape[0]) if q_start is not None else rows
    if q_start is not None and max_q_len < 1:
        max_q_len = int((q_start[1:] - q_start[:-1]).max()) if not q_start.is_cuda and q_start.numel() > 1 \
            else capacity
    if max_seq_len < 1:
        max_seq_len = int(seq_lens.max()) if not seq_lens.is_cuda and seq_lens.numel() else capacity
    options = sinks is not None or softcap > 0 or return_lse
    # The plan before any allocation: a refused one raises with nothing allocated.
    plan = None if num_seqs == 0 else _plan(q, lay, num_seqs, hq, int(max_seq_len), int(sliding_window),
                                            max(int(max_q_len), 1), rows, q_start is not None, options)
    out = torch.empty((rows, hq, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((rows, hq) if return_lse else (0,), dtype=torch.float32, device=q.device)
    if plan is None:
        return out, lse
    n = int(plan.workspace_bytes)
    ws = None if n == 0 else torch.empty(((n + 3) // 4,), dtype=torch.float32, device=q.device)
    sm = float(sm_scale) if sm_scale is not None else 1.0 / (d ** 0.5)
    _metrale.attention(plan, _dl(q), lay, _dl(k_cache), _dl(v_cache), scales_of(lay.format, k_scale, v_scale),
                       None if q_start is None else _dl(q_start), _dl(block_tables), _dl(seq_lens),
                       int(sliding_window), sm, None if sinks is None else _dl(sinks), float(softcap), _dl(out),
                       _dl(lse) if return_lse else None, None if ws is None else _dl(ws), _stream(q))
    return out, lse


@attention.register_fake
def _(q, k_cache, v_cache, block_tables, seq_lens, format, block_size, num_kv_heads, k_scale=1.0, v_scale=1.0,
      q_start=None, max_q_len=0, max_seq_len=0, sliding_window=0, sm_scale=None, sinks=None, softcap=0.0,
      return_lse=False, data_section_bytes=0):
    rows, hq, d = _check_q(q)
    return (q.new_empty((rows, hq, d), dtype=torch.bfloat16),
            q.new_empty((rows, hq) if return_lse else (0,), dtype=torch.float32))


__all__ = ["reshape_and_cache", "reshape_and_cache_counted", "attention"]
