"""The operations: cache write, absmax and calibration scales, decode (single pass, split-K,
reduce), the block-table check, backend queries.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional

import numpy as np

from . import _metrale
from ._metrale import KvCacheLayout
from ._arrays import (MAX_SPLITS, ArrayLike, _device_of, _dl, _empty, _is_cuda, _require_array, _require_writable,
                      _stream_handle, _torch_for_cuda)
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


def _q_heads(q: Any, head_dim: int, num_q_heads: Optional[int]) -> int:
    shape = tuple(getattr(q, "shape", ()))
    if num_q_heads is not None:
        return int(num_q_heads)
    if len(shape) == 3:
        return int(shape[1])
    if len(shape) == 4 and 1 in shape[1:3]:  # (batch, heads, 1, D) or (batch, 1, heads, D)
        return int(shape[2] if shape[1] == 1 else shape[1])
    if len(shape) == 2 and head_dim > 0 and shape[1] % head_dim == 0:
        return int(shape[1] // head_dim)
    raise ValueError(f"'q': expected shape (num_seqs, num_q_heads, {head_dim}), got {shape}")


def _default_out(q: Any, num_q_heads: int, head_dim: int):
    """The output of a call with out=None, of q's array type: a torch bf16 tensor
    for a torch q (CPU or CUDA), else NumPy uint16 bf16 bit patterns."""
    n = int(q.shape[0])
    if _is_cuda(q):
        torch = _torch_for_cuda("metrale: out=None")
        return torch.empty((n, num_q_heads, head_dim), dtype=torch.bfloat16, device=q.device)
    torch = sys.modules.get("torch")  # never imported here: only when the caller passes its tensors
    if torch is not None and isinstance(q, torch.Tensor):
        return torch.empty((n, num_q_heads, head_dim), dtype=torch.bfloat16)
    return np.empty((n, num_q_heads, head_dim), dtype=np.uint16)


def _sm_scale(sm_scale: Optional[float], head_dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    s = float(sm_scale)
    if not math.isfinite(s):
        raise ValueError(f"'sm_scale' = {sm_scale!r}; expected a finite float")
    return s


def _check_window(sliding_window: int) -> int:
    if not isinstance(sliding_window, (int, np.integer)) or sliding_window < 0:
        raise ValueError(f"'sliding_window' = {sliding_window!r}; expected an int >= 0 (0 = off)")
    return int(sliding_window)


def decode(q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
           out: Optional[ArrayLike] = None, *, sliding_window: int = 0, sm_scale: Optional[float] = None,
           num_q_heads: Optional[int] = None, stream: Any = None):
    """Single-pass paged decode attention (``paged_decode_attn``).

    q: bf16 ``(num_seqs, num_q_heads, head_dim)`` (or ``(num_seqs, num_q_heads*head_dim)``,
    rows may be strided); block_tables: int32 ``(num_seqs, max_blocks_per_seq)``;
    seq_lens: int32 ``(num_seqs,)``; out: bf16 ``(num_seqs, num_q_heads, head_dim)``,
    contiguous (allocated when None). q head h reads kv head
    ``h // (num_q_heads // num_kv_heads)``; ``sliding_window`` W > 0 attends
    to positions ``[max(0, L-W), L)``; ``sm_scale`` defaults to 1/sqrt(head_dim).
    Returns out.
    """
    view, hq, D, block_tables, seq_lens = _decode_inputs(q, cache, block_tables, seq_lens, num_q_heads)
    out = _decode_out(q, out, hq, D)
    _metrale.decode_single(_dl(q), hq, view.layout, _dl(view.k), _dl(view.v), view.scales, _dl(block_tables),
                           _dl(seq_lens), _check_window(sliding_window), _sm_scale(sm_scale, D), _dl(out),
                           _stream_handle(q, stream))
    return out


def attend(q: ArrayLike, cache: KVCacheView, q_start: ArrayLike, block_tables: ArrayLike, seq_lens: ArrayLike,
           out: Optional[ArrayLike] = None, *, sliding_window: int = 0, sm_scale: Optional[float] = None,
           sinks: Optional[ArrayLike] = None, softcap: float = 0.0, lse: Optional[ArrayLike] = None,
           max_q_len: int = 0, num_q_heads: Optional[int] = None, stream: Any = None):
    """Query runs over the paged cache (SYSTEM.md 8; ``paged_attn``), single pass.

    Sequence i's run is rows ``q_start[i] .. q_start[i+1]`` of q (int32
    ``(num_seqs + 1,)``, non-decreasing, ``q_start[0] = 0``, at most
    ``seq_lens[i]`` rows, their K/V already in the cache); row j of a run of n
    sits at position ``L - n + j`` and attends ``[max(0, p + 1 - W), p]``.
    ``sinks``: float32 ``(num_q_heads,)`` logits joining the softmax
    denominator only (-inf: none); ``softcap`` c > 0 caps each logit to
    ``c * tanh(s / c)``; ``lse``: optional float32 ``(rows, num_q_heads)``
    receiving ``m + ln(l)``. ``max_q_len`` bounds every run (the GPU's grid;
    0: the longest run of a host ``q_start``, else the block table's capacity,
    a grid mostly of empty CTAs: pass it for a CUDA ``q_start``). Returns out
    ``(rows, num_q_heads, D)``.
    """
    view, hq, D, block_tables, seq_lens = _decode_inputs(q, cache, block_tables, seq_lens, num_q_heads)
    _require_array(q_start, "q_start")
    q_start = _int32_index(q_start, "q_start")
    if not max_q_len and isinstance(q_start, np.ndarray) and q_start.size > 1:
        max_q_len = int(np.diff(q_start).max(initial=1))  # host q_start: the longest run, read here
    out = _decode_out(q, out, hq, D)
    if lse is not None:
        _require_writable(lse, "lse")
    _metrale.attend(None, _dl(q), hq, view.layout, _dl(view.k), _dl(view.v), view.scales, _dl(q_start),
                    _dl(block_tables), _dl(seq_lens), _check_window(sliding_window), _sm_scale(sm_scale, D),
                    None if sinks is None else _dl(sinks), _check_softcap(softcap), _dl(out),
                    None if lse is None else _dl(lse), None, int(max_q_len), _stream_handle(q, stream))
    return out


def _check_softcap(softcap: Any) -> float:
    c = float(softcap)
    if not math.isfinite(c) or c < 0:
        raise ValueError(f"'softcap' = {softcap!r}; expected a finite float >= 0 (0 = off)")
    return c


def decode_splitk(q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
                  workspace: ArrayLike, num_splits: int, *, sliding_window: int = 0,
                  sm_scale: Optional[float] = None, num_q_heads: Optional[int] = None, stream: Any = None):
    """Split-K pass (``paged_decode_attn_splitk``): writes each split's partial state
    into ``workspace`` (float32, >= ``splitk_workspace_bytes`` bytes): records of
    ``head_dim + 2`` floats (normalised partial output, m, l), record index
    ``(seq * num_q_heads + h) * num_splits + split``. Merge with
    :func:`decode_reduce`. Returns workspace.
    """
    _check_splits(num_splits)
    view, hq, D, block_tables, seq_lens = _decode_inputs(q, cache, block_tables, seq_lens, num_q_heads)
    _require_writable(workspace, "workspace")
    _metrale.decode_splitk(_dl(q), hq, view.layout, _dl(view.k), _dl(view.v), view.scales, _dl(block_tables),
                           _dl(seq_lens), _check_window(sliding_window), _sm_scale(sm_scale, D), _dl(workspace),
                           int(num_splits), _stream_handle(q, stream))
    return workspace


def decode_reduce(workspace: ArrayLike, out: ArrayLike, num_splits: int, *, num_q_heads: Optional[int] = None,
                  head_dim: Optional[int] = None, stream: Any = None):
    """Merges split-K partial states into bf16 ``out`` (``paged_decode_attn_reduce``):
    ``M = max m_i, w_i = l_i exp(m_i - M), out = sum w_i o_i / sum w_i``.
    out: ``(num_seqs, num_q_heads, head_dim)`` bf16 (or 2-D with num_q_heads and
    head_dim given). Returns out.
    """
    _require_array(workspace, "workspace")
    _require_writable(out, "out")
    _check_splits(num_splits)
    shape = tuple(getattr(out, "shape", ()))
    if num_q_heads is None or head_dim is None:
        if len(shape) != 3:
            raise ValueError(f"'out': expected shape (num_seqs, num_q_heads, head_dim), got {shape} "
                             "(pass num_q_heads= and head_dim= for a 2-D out)")
        num_q_heads = shape[1] if num_q_heads is None else num_q_heads
        head_dim = shape[2] if head_dim is None else head_dim
    _metrale.reduce(_dl(workspace), int(num_q_heads), int(head_dim), int(num_splits), _dl(out),
                    _stream_handle(out, stream))
    return out


def _check_splits(num_splits: Any) -> None:
    if not isinstance(num_splits, (int, np.integer)) or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"'num_splits' = {num_splits!r}; expected an int in [1, {MAX_SPLITS}]")


def _decode_inputs(q, cache, block_tables, seq_lens, num_q_heads):
    """The view, q heads, head_dim, block tables and lengths of a decode call, its
    arrays checked (int64 host tables and lengths converted to int32)."""
    view = _as_view(cache)
    for a, n in ((q, "q"), (block_tables, "block_tables"), (seq_lens, "seq_lens")):
        _require_array(a, n)
    D = int(view.layout.head_dim)
    return view, _q_heads(q, D, num_q_heads), D, _int32_index(block_tables, "block_tables"), \
        _int32_index(seq_lens, "seq_lens")


def _int32_index(x: Any, name: str) -> Any:
    """Block tables, lengths and q_start are int32 on both backends. An int64 host
    array (NumPy's and torch's default) is converted here, a copy as small as the
    table; a CUDA one must be int32 already (a conversion there would allocate in
    the decode step: convert once, when the table is built)."""
    if isinstance(x, np.ndarray) and x.dtype == np.int64:
        if x.size and (int(x.max()) > 2**31 - 1 or int(x.min()) < -2**31):
            raise ValueError(f"'{name}': int64 values outside int32's range")
        return x.astype(np.int32)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and not x.is_cuda and x.dtype == torch.int64:
        return _int32_index(x.numpy(), name)
    return x


def _decode_out(q, out, num_q_heads, head_dim):
    if out is None:
        return _default_out(q, num_q_heads, head_dim)
    _require_writable(out, "out")
    return out


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
