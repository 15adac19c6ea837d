"""The operations beside attention: cache write, absmax and calibration scales, the
block-table check, backend queries.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _metrale
from ._metrale import KvCacheLayout
from ._arrays import ArrayLike, _device_of, _dl, _empty, _is_cuda, _require_array, _require_writable, _stream_handle
from .planner import _check_window
from .view import KVCacheView, _as_view, _layout_of


def reshape_and_cache(key: ArrayLike, value: ArrayLike, slot_mapping: ArrayLike, cache: KVCacheView, *,
                      skipped: Optional[ArrayLike] = None, saturated: Optional[ArrayLike] = None,
                      stream: Any = None) -> Optional[int]:
    """Writes each token's K and V into its slot of the paged caches, quantising
    to the cache's format (FP8 with k/v_scale, NVFP4 with the global scales).

    key, value: bf16, read where they lie (never copied), the last dimension
    (head_dim) contiguous, token and head strides multiples of 8 elements:

    * ``(num_tokens, num_kv_heads, head_dim)`` with any token and head
      strides: rows of a fused QKV output, transformers' cache tensor sliced
      at one position (``key[:, :, -1]``: strides ``(Hkv*S*D, S*D, 1)``), a
      permuted ``(S, Hkv, D)`` view of one sequence's tokens;
    * ``(num_tokens, num_kv_heads * head_dim)`` rows;
    * ``(batch, num_kv_heads, seq, head_dim)``, transformers' head-major
      layout: ``batch * seq`` tokens, b-major (token ``b * seq + s``); one
      write when the tokens are evenly spaced (seq 1, batch 1, or a
      ``(batch, seq, heads, D)`` projection transposed), else one per b;
    * ``(batch, 1, num_kv_heads, head_dim)``: one token per sequence.

    slot_mapping: contiguous int64, one slot per token (``(num_tokens,)`` or
    ``(batch, seq)``), ``block * block_size + offset``; a negative slot is
    padding (skipped); a slot past the capacity is skipped and counted.
    skipped: optional int32 array of >= 1 element on the cache's device,
    incremented per out-of-capacity slot.
    saturated: optional contiguous int64 array of >= 2 elements on the
    cache's device: ``[0]`` += K elements, ``[1]`` += V elements of the
    written tokens past the range of the cache's scales (clipped to the
    format's largest value; FP8: ``|x| / k_scale > 464``, NVFP4:
    ``|x| / (6 * global_scale) > 464``, 464 being where rounding to E4M3's
    largest code 448 ends; BF16 never). No synchronisation.
    Returns the number of skipped out-of-capacity tokens on CPU, None on CUDA
    (use ``skipped`` there: reading it back would synchronise).
    """
    view = _as_view(cache)
    for a, n in ((key, "key"), (value, "value"), (slot_mapping, "slot_mapping")):
        _require_array(a, n)
    _require_writable(view.k, "k_cache")
    _require_writable(view.v, "v_cache")
    if skipped is not None:
        _require_writable(skipped, "skipped")
    if saturated is not None:
        _require_writable(saturated, "saturated")
    r = _metrale.reshape_and_cache(_dl(key), _dl(value), _dl(slot_mapping), view.layout, _dl(view.k), _dl(view.v),
                                   view.scales, None if skipped is None else _dl(skipped),
                                   None if saturated is None else _dl(saturated), _stream_handle(key, stream))
    return None if r < 0 else int(r)


def bf16_absmax(x: ArrayLike, out: Optional[ArrayLike] = None, *, stream: Any = None):
    """max |x| of bf16 values (NaNs ignored), folded into ``out``.

    x: bf16 (or uint16 bit patterns), the last dimension contiguous, any
    other strides (a fused QKV slice, transformers' ``key[:, :, -1]``, a
    permuted view), read where it lies. out: float32 array of >= 1 element on x's device;
    ``out[0] = max(out[0], max|x|)`` (zero it before the first batch).
    Without ``out``: on CPU returns the float; on CUDA allocates a zeroed
    float32[1] torch tensor and returns it (no synchronisation).
    """
    _require_array(x, "x")
    if out is None:
        if _is_cuda(x):
            out = _empty((1,), "float32", ("cuda", _device_of(x)[1]), zero=True)
            _metrale.bf16_absmax(_dl(x), _dl(out), _stream_handle(x, stream))
            return out
        buf = np.zeros(1, dtype=np.float32)
        _metrale.bf16_absmax(x, buf, 0)
        return float(buf[0])
    _require_writable(out, "out")
    _metrale.bf16_absmax(_dl(x), _dl(out), _stream_handle(x, stream))
    return out


def fp8_scale_from_absmax(absmax: float) -> float:
    """FP8 per-tensor scale: absmax / 448 (1.0 for absmax 0)."""
    return float(_metrale.fp8_scale_from_absmax(float(absmax)))


def nvfp4_global_scale_from_absmax(absmax: float) -> float:
    """NVFP4 per-tensor second scale: absmax / (448 * 6) (1.0 for absmax 0)."""
    return float(_metrale.nvfp4_global_scale_from_absmax(float(absmax)))


def splitk_workspace_bytes(num_seqs: int, num_q_heads: int, head_dim: int, num_splits: int) -> int:
    """Bytes of the f32 split-K workspace: num_seqs * num_q_heads * num_splits * (head_dim + 2) * 4."""
    return int(_metrale.splitk_workspace_bytes(num_seqs, num_q_heads, head_dim, num_splits))


def validate_block_tables(layout: KvCacheLayout, block_tables: ArrayLike, seq_lens: ArrayLike,
                          sliding_window: int = 0) -> None:
    """Debug check on host copies: every length in [0, max_blocks_per_seq * block_size] and
    every attended page a valid page of the cache. Raises ValueError naming the first bad sequence."""
    layout = _layout_of(layout)
    _metrale.validate_block_tables(layout, block_tables, seq_lens, _check_window(sliding_window))


def cuda_available() -> bool:
    """True when a CUDA device usable by this build (sm_90) is present."""
    return bool(_metrale.cuda_available())


def cpu_num_threads() -> int:
    """Worker threads of the CPU backend."""
    return int(_metrale.cpu_num_threads())


def set_cpu_num_threads(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"'n' = {n!r}; expected an int >= 1")
    _metrale.cpu_set_num_threads(n)
