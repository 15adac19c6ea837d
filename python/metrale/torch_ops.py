"""PyTorch custom operators over metrale (``torch.library``): the cache write, decode and
query-run attention as ``torch.ops.metrale.*``, with fake (meta) implementations, so that
``torch.compile(fullgraph=True)`` traces a decode step without a graph break and a CUDA
graph captures it (the ops enqueue on the current stream and never synchronise).

Operators (importing this module registers them; needs torch >= 2.4):

* ``metrale::reshape_and_cache(key, value, slot_mapping, k_cache, v_cache, layout, scales)``
  mutates ``k_cache`` / ``v_cache`` (returns nothing);
  ``metrale::reshape_and_cache_counted(..., scales, saturated)`` also adds the saturated K
  and V elements to ``saturated`` (int64 ``[2]`` on the cache's device);
* ``metrale::decode(q, k_cache, v_cache, block_tables, seq_lens, layout, scales, sm_scale,
  sliding_window, max_seq_len) -> out`` ``(num_seqs, num_q_heads, head_dim)`` bf16;
* ``metrale::attend(q, k_cache, v_cache, q_start, block_tables, seq_lens, sinks, layout,
  scales, sm_scale, sliding_window, softcap, max_q_len, max_seq_len) -> out``
  ``(rows, num_q_heads, head_dim)`` bf16.

A cache enters an operator as its two uint8 buffers plus ``layout`` (``layout_spec``:
a list of ints describing the KvCacheLayout) and ``scales`` (``[k_scale, v_scale,
k_global_scale, v_global_scale]``), plain values torch.compile specialises on (scales
are fixed once a layer holds tokens). ``max_seq_len`` sizes the decode plan (any length
up to the block table's capacity runs on it; it only tunes the split count). Each
operator makes its plan once per shape (a host-side dictionary) and allocates only its
output and, where the plan merges through one, its split-K workspace, through torch's
allocator (graph-safe).
"""

from __future__ import annotations

import atexit
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _metrale
from ._metrale import KvCacheLayout, KvFormat
from ._arrays import _dl
from .view import KVCacheView

_FORMAT_IDS = {KvFormat.bf16: 0, KvFormat.fp8_e4m3: 1, KvFormat.nvfp4: 2}


def layout_spec(layout: KvCacheLayout) -> List[int]:
    """The operators' description of a layout: [format, num_blocks, block_size, num_kv_heads,
    head_dim, page_stride_bytes, data_section_bytes] (format 0 bf16, 1 fp8, 2 nvfp4)."""
    if isinstance(layout, KVCacheView):
        layout = layout.layout
    if not isinstance(layout, KvCacheLayout):
        raise TypeError(f"'layout': expected a metrale.KvCacheLayout or KVCacheView, got {type(layout).__name__}")
    return [_FORMAT_IDS[layout.format], int(layout.num_blocks), int(layout.block_size), int(layout.num_kv_heads),
            int(layout.head_dim), int(layout.page_stride_bytes), int(layout.data_section_bytes)]


_LAYOUTS: Dict[Tuple[int, ...], KvCacheLayout] = {}


def _layout(spec: List[int]) -> KvCacheLayout:
    key = tuple(int(x) for x in spec)
    lay = _LAYOUTS.get(key)
    if lay is not None:
        return lay
    if len(key) != 7:
        raise ValueError(f"'layout' = {list(spec)!r}; expected the 7 ints of metrale.torch_ops.layout_spec(layout)")
    fmt, nb, bs, hkv, d, page_stride, data_section = key
    if fmt == 0:
        lay = KvCacheLayout.bf16(nb, bs, hkv, d)
    elif fmt == 1:
        lay = KvCacheLayout.fp8(nb, bs, hkv, d, page_stride)
    elif fmt == 2:
        lay = KvCacheLayout.nvfp4(nb, bs, hkv, d, page_stride, data_section)
    else:
        raise ValueError(f"'layout': format id {fmt}; expected 0 (bf16), 1 (fp8) or 2 (nvfp4)")
    lay.validate()
    if int(lay.page_stride_bytes) != page_stride:
        raise ValueError(f"'layout' = {list(spec)!r}: page_stride_bytes {page_stride} does not describe a "
                         f"{lay!r} (bf16 pages are dense)")
    _LAYOUTS[key] = lay
    return lay


@atexit.register
def _release() -> None:
    """torch's operator registry keeps this module alive past the extension's teardown: drop the
    bound objects first (else nanobind reports them as leaked)."""
    _PLANS.clear()
    _LAYOUTS.clear()


def _scales(scales: List[float]) -> Tuple[float, float, float, float]:
    if len(scales) != 4:
        raise ValueError(f"'scales' = {list(scales)!r}; expected [k_scale, v_scale, k_global_scale, v_global_scale]")
    return (float(scales[0]), float(scales[1]), float(scales[2]), float(scales[3]))


def _stream(t: torch.Tensor) -> int:
    return int(torch.cuda.current_stream(t.device).cuda_stream) if t.is_cuda else 0


_PLANS: Dict[tuple, Any] = {}


def _plan(device: torch.device, num_seqs: int, num_q_heads: int, lay: KvCacheLayout, spec: List[int],
          max_seq_len: int, window: int, max_q_len: int, num_q_rows: int, attn_options: bool):
    """The plan of one shape, made once (host work) and kept (the last 64 shapes)."""
    index = -1 if device.type == "cpu" else (device.index if device.index is not None
                                             else torch.cuda.current_device())
    key = (index, num_seqs, num_q_heads, tuple(spec), max_seq_len, window, max_q_len, num_q_rows, attn_options)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _metrale.plan_decode(num_seqs, num_q_heads, lay, max_seq_len, window, index, 0, "automatic",
                                    "automatic", "automatic", max_q_len, num_q_rows, attn_options)
        if len(_PLANS) >= 64:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _workspace(plan: Any, like: torch.Tensor) -> Optional[torch.Tensor]:
    n = int(plan.workspace_bytes)
    return None if n == 0 else torch.empty(((n + 3) // 4,), dtype=torch.float32, device=like.device)


def _q_heads(q: torch.Tensor, head_dim: int) -> int:
    if q.dim() == 3:
        return int(q.shape[1])
    if q.dim() == 2 and q.shape[1] % head_dim == 0:
        return int(q.shape[1] // head_dim)
    raise ValueError(f"'q': shape {tuple(q.shape)}; expected (rows, num_q_heads, {head_dim}) "
                     f"or (rows, num_q_heads * {head_dim})")


def _check_max_seq_len(block_tables: torch.Tensor, lay: KvCacheLayout, max_seq_len: int) -> int:
    if max_seq_len > 0:
        return int(max_seq_len)
    return int(block_tables.shape[-1]) * int(lay.block_size) if block_tables.dim() == 2 else 0


def _write(key, value, slot_mapping, k_cache, v_cache, layout, scales, saturated) -> None:
    lay = _layout(layout)
    _metrale.reshape_and_cache(_dl(key), _dl(value), _dl(slot_mapping), lay, _dl(k_cache), _dl(v_cache),
                               _scales(scales), None, None if saturated is None else _dl(saturated), _stream(key))


# Two operators, not one with `saturated: Optional[Tensor] = None`: torch 2.11's
# ADInplaceOrView kernel of a custom op indexes the positional arguments by the
# schema's mutated indices, so a mutated argument left to its default raised
# IndexError (torch 2.15 checks the bound).
@torch.library.custom_op("metrale::reshape_and_cache", mutates_args=("k_cache", "v_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, layout: List[int], scales: List[float]) -> None:
    """metrale.reshape_and_cache as an operator (negative slots are padding; slots past the
    capacity are skipped): key / value read where they lie (token and head strides)."""
    _write(key, value, slot_mapping, k_cache, v_cache, layout, scales, None)


@reshape_and_cache.register_fake
def _(key, value, slot_mapping, k_cache, v_cache, layout, scales) -> None:
    return None


@torch.library.custom_op("metrale::reshape_and_cache_counted", mutates_args=("k_cache", "v_cache", "saturated"))
def reshape_and_cache_counted(key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor,
                              k_cache: torch.Tensor, v_cache: torch.Tensor, layout: List[int], scales: List[float],
                              saturated: torch.Tensor) -> None:
    """reshape_and_cache that also adds the write's clipped K and V elements to ``saturated``'s
    two int64 counters (no synchronisation)."""
    _write(key, value, slot_mapping, k_cache, v_cache, layout, scales, saturated)


@reshape_and_cache_counted.register_fake
def _(key, value, slot_mapping, k_cache, v_cache, layout, scales, saturated) -> None:
    return None


@torch.library.custom_op("metrale::decode", mutates_args=())
def decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           seq_lens: torch.Tensor, layout: List[int], scales: List[float], sm_scale: float, sliding_window: int,
           max_seq_len: int) -> torch.Tensor:
    """Paged decode of one query row per sequence, with the planner's plan for this shape."""
    lay = _layout(layout)
    d = int(lay.head_dim)
    hq = _q_heads(q, d)
    n = int(q.shape[0])
    out = torch.empty((n, hq, d), dtype=torch.bfloat16, device=q.device)
    if n == 0:
        return out
    plan = _plan(q.device, n, hq, lay, layout, _check_max_seq_len(block_tables, lay, max_seq_len),
                 int(sliding_window), 1, 0, False)
    ws = _workspace(plan, q)
    _metrale.run_decode(plan, _dl(q), lay, _dl(k_cache), _dl(v_cache), _scales(scales), _dl(block_tables),
                        _dl(seq_lens), float(sm_scale), _dl(out), None if ws is None else _dl(ws),
                        int(sliding_window), _stream(q))
    return out


@decode.register_fake
def _(q, k_cache, v_cache, block_tables, seq_lens, layout, scales, sm_scale, sliding_window, max_seq_len):
    d = int(layout[4])
    return q.new_empty((q.shape[0], _q_heads(q, d), d), dtype=torch.bfloat16)


@torch.library.custom_op("metrale::attend", mutates_args=())
def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, q_start: torch.Tensor,
           block_tables: torch.Tensor, seq_lens: torch.Tensor, sinks: Optional[torch.Tensor], layout: List[int],
           scales: List[float], sm_scale: float, sliding_window: int, softcap: float, max_q_len: int,
           max_seq_len: int) -> torch.Tensor:
    """Query runs over the paged cache (SYSTEM.md 8): sequence i's rows are q[q_start[i]:q_start[i+1]],
    causal, aligned to the end of its cache; ``max_q_len`` must bound every run."""
    lay = _layout(layout)
    d = int(lay.head_dim)
    hq = _q_heads(q, d)
    rows = int(q.shape[0])
    out = torch.empty((rows, hq, d), dtype=torch.bfloat16, device=q.device)
    num_seqs = int(q_start.shape[0]) - 1
    if rows == 0 or num_seqs <= 0:
        return out
    if max_q_len < 1:
        raise ValueError(f"'max_q_len' = {max_q_len!r}; expected an int >= 1 bounding every run")
    options = sinks is not None or softcap > 0
    plan = _plan(q.device, num_seqs, hq, lay, layout, _check_max_seq_len(block_tables, lay, max_seq_len),
                 int(sliding_window), int(max_q_len), rows, options)
    ws = _workspace(plan, q)
    _metrale.attend(plan, _dl(q), hq, lay, _dl(k_cache), _dl(v_cache), _scales(scales), _dl(q_start),
                    _dl(block_tables), _dl(seq_lens), int(sliding_window), float(sm_scale),
                    None if sinks is None else _dl(sinks), float(softcap), _dl(out), None,
                    None if ws is None else _dl(ws), int(max_q_len), _stream(q))
    return out


@attend.register_fake
def _(q, k_cache, v_cache, q_start, block_tables, seq_lens, sinks, layout, scales, sm_scale, sliding_window, softcap,
      max_q_len, max_seq_len):
    d = int(layout[4])
    return q.new_empty((q.shape[0], _q_heads(q, d), d), dtype=torch.bfloat16)


__all__ = ["layout_spec", "reshape_and_cache", "reshape_and_cache_counted", "decode", "attend"]
