"""metrale.attention: attention over the paged cache for every query shape (decode, query
runs, sinks, soft-cap, lse) in one call, and reduce_states for split-K states made elsewhere."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _metrale
from ._arrays import ArrayLike, _device_of, _DLPACK_CPU, _require_array, _require_writable, _stream_handle, _dl
from .planner import Planner, _check_int, _host_values, _int32_index, _q_shape
from .view import KVCacheView, _as_view


def attention(q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
              out: Optional[ArrayLike] = None, *, q_start: Optional[ArrayLike] = None, max_q_len: int = 0,
              max_seq_len: int = 0, sliding_window: int = 0, sm_scale: Optional[float] = None,
              sinks: Optional[ArrayLike] = None, softcap: float = 0.0, lse: Optional[ArrayLike] = None,
              return_lse: bool = False, num_splits: int = 0, merge: str = "automatic",
              max_workspace_bytes: int = 0, workspace: Optional[ArrayLike] = None,
              num_q_heads: Optional[int] = None, stream: Any = None):
    """Attention of query rows over the paged cache (docs/query_runs.md), every shape in one call.

    q: bf16 (torch.bfloat16, or uint16 bit patterns), any ``(rows, num_q_heads, head_dim)``
    view whose last dimension is contiguous (row and head strides multiples of 8: a fused
    QKV slice, transformers' ``(1, heads, tokens, D)`` query read as ``(tokens, heads, D)``),
    or ``(rows, num_q_heads * head_dim)``, ``(batch, heads, 1, D)``, ``(batch, 1, heads, D)``,
    ``(1, heads, tokens, D)``. block_tables: int32 ``(num_seqs, max_blocks_per_seq)``;
    seq_lens: int32 ``(num_seqs,)`` (int64 host arrays are converted).

    * Decode (``q_start`` None): one row per sequence, rows = num_seqs.
    * Query runs: ``q_start`` int32 ``(num_seqs + 1,)``, non-decreasing, ``q_start[0] = 0``,
      ``q_start[-1] = rows``; sequence i's rows ``q_start[i]:q_start[i+1]`` (at most
      ``seq_lens[i]``, their K/V already written) sit at the end of its cache, causal: row j
      of a run of n sits at ``p = L - n + j`` and attends ``[max(0, p + 1 - W), p]``.
      ``max_q_len`` bounds every run (0: the longest run of a host q_start; for a CUDA
      q_start the block table's capacity, a grid mostly of empty CTAs: pass it).

    ``sliding_window`` W (0: off); ``sm_scale`` (default 1/sqrt(head_dim)); ``sinks`` float32
    ``(num_q_heads,)`` logits joining the softmax denominator only; ``softcap`` c > 0 caps each
    logit to ``c * tanh(s / c)``; ``lse`` float32 ``(rows, num_q_heads)`` receives
    ``m + ln(l)`` (-inf where nothing is attended), ``return_lse=True`` allocates it when
    not given and returns ``(out, lse)``. out: bf16 ``(rows, num_q_heads, head_dim)``,
    C-contiguous (allocated when None, of q's array type).

    Plan options as :class:`Planner`'s (``num_splits``, ``merge``, ``max_workspace_bytes``);
    ``merge="states_only"`` writes the split-K states into ``workspace`` (float32, >=
    ``splitk_workspace_bytes(rows, heads, D, num_splits)`` bytes) and returns it, for
    :func:`reduce_states`. This call plans the batch (host work) and may allocate the
    split-K workspace: a decode loop or a CUDA graph makes a Planner once and calls
    ``Planner.run``. Returns out (or as said above).
    """
    view = _as_view(cache)
    for a, n in ((q, "q"), (block_tables, "block_tables"), (seq_lens, "seq_lens")):
        _require_array(a, n)
    _check_int("max_q_len", max_q_len, 0, what=" (0: from q_start)")
    _check_int("max_seq_len", max_seq_len, 0, what=" (0: from seq_lens)")
    D = int(view.layout.head_dim)
    rows, hq = _q_shape(q, D, num_q_heads)
    block_tables = _int32_index(block_tables, "block_tables")
    seq_lens = _int32_index(seq_lens, "seq_lens")
    bt_shape = tuple(getattr(block_tables, "shape", ()))
    num_seqs = int(bt_shape[0]) if q_start is not None and len(bt_shape) == 2 else rows
    capacity = int(bt_shape[1]) * int(view.layout.block_size) if len(bt_shape) == 2 else 0
    if q_start is not None:
        _require_array(q_start, "q_start")
        q_start = _int32_index(q_start, "q_start")
        if not max_q_len:
            host = _host_values(q_start)
            max_q_len = int(np.diff(host).max(initial=1)) if host is not None and host.size > 1 else capacity
    if not max_seq_len:
        host = _host_values(seq_lens)
        max_seq_len = max(int(host.max(initial=0)), 0) if host is not None else capacity
    dev = _device_of(q)
    device = "cpu" if dev[0] == _DLPACK_CPU else f"cuda:{dev[1]}"
    options = sinks is not None or bool(softcap) or lse is not None or return_lse
    planner = Planner(num_seqs, hq, view.layout, int(max_seq_len), sliding_window, device,
                      max_q_len=max(int(max_q_len), 1), num_q_rows=rows, query_runs=q_start is not None,
                      attn_options=options, num_splits=num_splits, merge=merge,
                      max_workspace_bytes=max_workspace_bytes, allocate_workspace=workspace is None,
                      runs_plan=False)
    return planner.run(q, view, block_tables, seq_lens, out, workspace, sm_scale, q_start=q_start, sinks=sinks,
                       softcap=softcap, lse=lse, return_lse=return_lse, stream=stream)


def reduce_states(workspace: ArrayLike, out: ArrayLike, num_splits: int, *, sinks: Optional[ArrayLike] = None,
                  lse: Optional[ArrayLike] = None, num_q_heads: Optional[int] = None,
                  head_dim: Optional[int] = None, stream: Any = None):
    """Merges split-K states (a "states_only" run's, or states computed anywhere: records of
    ``head_dim + 2`` float32, the split's normalised partial output then m and l, record
    index ``(row * num_q_heads + h) * num_splits + split``) into bf16 ``out``:
    ``M = max m_i, w_i = l_i exp(m_i - M), out = sum w_i o_i / sum w_i``; ``sinks`` join
    the denominator at the final normalisation; ``lse`` float32 ``(rows, num_q_heads)``
    receives ``M + ln(sum w_i)``. out: ``(rows, num_q_heads, head_dim)`` bf16 (or 2-D with
    num_q_heads and head_dim given). Returns out.
    """
    _require_array(workspace, "workspace")
    _require_writable(out, "out")
    if not isinstance(num_splits, (int, np.integer)) or not 1 <= num_splits <= _metrale.max_splits():
        raise ValueError(f"'num_splits' = {num_splits!r}; expected an int in [1, {_metrale.max_splits()}]")
    shape = tuple(getattr(out, "shape", ()))
    if num_q_heads is None or head_dim is None:
        if len(shape) != 3:
            raise ValueError(f"'out': expected shape (rows, num_q_heads, head_dim), got {shape} "
                             "(pass num_q_heads= and head_dim= for a 2-D out)")
        num_q_heads = shape[1] if num_q_heads is None else num_q_heads
        head_dim = shape[2] if head_dim is None else head_dim
    if sinks is not None:
        _require_array(sinks, "sinks")
    if lse is not None:
        _require_writable(lse, "lse")
    _metrale.reduce_states(_dl(workspace), int(num_q_heads), int(head_dim), int(num_splits), _dl(out),
                           None if sinks is None else _dl(sinks), None if lse is None else _dl(lse),
                           _stream_handle(out, stream))
    return out
