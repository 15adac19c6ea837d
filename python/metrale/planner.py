"""Planner: the decode plan of one batch shape, made once and reused for every layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _metrale
from ._metrale import KvCacheLayout
from ._arrays import (_DLPACK_CPU, _DLPACK_CUDA, ArrayLike, _device_of, _dl, _empty, _parse_device, _require_array,
                      _stream_handle)
from .ops import _check_softcap, _check_window, _decode_inputs, _decode_out, _int32_index, _sm_scale
from .view import KVCacheView, _as_view, _layout_of

if TYPE_CHECKING:
    from .cache import PagedKVCache


def _cache_device(cache: Any) -> str:
    """Where a PagedKVCache or a KVCacheView lives ('cpu' for a bare layout)."""
    dev = getattr(cache, "device", None)
    if isinstance(dev, str):
        return dev
    k = getattr(cache, "k", None)
    if k is not None and not isinstance(k, (int, float)):
        d = _device_of(k)
        return "cpu" if d[0] == _DLPACK_CPU else f"cuda:{d[1]}"
    return "cpu"


class Planner:
    """The decode plan of one batch shape, made once and reused for every layer.

    ``Planner(num_seqs, num_q_heads, layout, max_seq_len, sliding_window=0, device=None)``
    (device None: the cache's when `layout` is a PagedKVCache or a view, else the
    CPU) makes a :class:`DecodePlan` (``self.plan``) for the target: the GPU on
    CUDA (its SMs, TMA, cluster residency), the thread pool on CPU. The plan
    carries every launch decision: ``num_splits``, ``merge`` ("single_pass",
    "cluster" or "workspace"), ``load_path``, ``pair_kv_heads``, ``grid``,
    ``workspace_bytes``. The keyword options force a decision (benchmarks,
    tests): ``num_splits`` (0 = planner), ``pairing`` ("automatic", "off",
    "on"), ``load_path`` ("automatic", "registers", "tma"), ``merge``
    ("automatic", "single_pass", "cluster", "workspace"), ``prefill``
    ("automatic", "off", "on": query runs in the tensor-core prefill kernel,
    ``plan.prefill``; the planner takes it for runs of at least 32 (bf16) or
    64 (fp8, NVFP4) (row, q head) pairs per kv head (128 over fewer than 4096
    attended positions) when its grid, split over a long context where needed
    (merged through the workspace), fills half the GPU). The planner owns the
    split-K workspace the plan needs on `device` (allocated once here, never
    in ``run``). ``run`` enqueues what the plan says without synchronising
    or allocating when ``out`` is given, so it can be captured in a CUDA
    graph. A batch of up to ``num_seqs`` sequences and any lengths
    may run on one plan (the plan is a performance choice, not a correctness
    one).
    """

    def __init__(self, num_seqs: int, num_q_heads: int, layout: Union[KvCacheLayout, KVCacheView, "PagedKVCache"],
                 max_seq_len: int, sliding_window: int = 0, device: Any = None, *, allocate_workspace: bool = True,
                 num_splits: int = 0, pairing: str = "automatic", load_path: str = "automatic",
                 merge: str = "automatic", max_q_len: int = 1, num_q_rows: int = 0, attn_options: bool = False,
                 prefill: str = "automatic"):
        if device is None:  # the cache's device (a bare layout: the CPU)
            device = _cache_device(layout)
        layout = _layout_of(layout)
        if not isinstance(layout, KvCacheLayout):
            raise TypeError(f"'layout': expected a metrale.KvCacheLayout, got {type(layout).__name__}")
        for name, val in (("num_seqs", num_seqs), ("num_q_heads", num_q_heads), ("max_seq_len", max_seq_len)):
            if not isinstance(val, (int, np.integer)) or val < 0:
                raise ValueError(f"'{name}' = {val!r}; expected an int >= 0")
        if num_q_heads == 0 or num_q_heads % layout.num_kv_heads != 0:
            raise ValueError(f"'num_q_heads' = {num_q_heads}; expected a positive multiple of the cache's "
                             f"num_kv_heads = {layout.num_kv_heads} (GQA)")
        self.num_seqs = int(num_seqs)
        self.num_q_heads = int(num_q_heads)
        self.layout = layout
        self.max_seq_len = int(max_seq_len)
        self.sliding_window = _check_window(sliding_window)
        self._device = _parse_device(device)
        if not isinstance(num_splits, (int, np.integer)) or not 0 <= num_splits <= _metrale.max_splits():
            raise ValueError(f"'num_splits' = {num_splits!r}; expected 0 (the planner's) or an int in "
                             f"[1, {_metrale.max_splits()}]")
        for name, val in (("pairing", pairing), ("load_path", load_path), ("merge", merge), ("prefill", prefill)):
            if not isinstance(val, str):
                raise TypeError(f"'{name}': expected a str, got {type(val).__name__}")
        device_index = -1 if self._device[0] == "cpu" else int(self._device[1])
        if not isinstance(max_q_len, (int, np.integer)) or max_q_len < 1:
            raise ValueError(f"'max_q_len' = {max_q_len!r}; expected an int >= 1 (1: decode)")
        self.plan = _metrale.plan_decode(self.num_seqs, self.num_q_heads, layout, self.max_seq_len,
                                         self.sliding_window, device_index, int(num_splits), pairing, load_path,
                                         merge, int(max_q_len), int(num_q_rows), bool(attn_options), prefill)
        self.workspace = None
        if allocate_workspace and self.plan.workspace_bytes > 0:
            self.workspace = _empty(((self.plan.workspace_bytes + 3) // 4,), "float32", self._device)

    @property
    def num_splits(self) -> int:
        return int(self.plan.num_splits)

    @property
    def workspace_bytes(self) -> int:
        return int(self.plan.workspace_bytes)

    @property
    def device(self) -> str:
        return "cpu" if self._device[0] == "cpu" else f"cuda:{self._device[1]}"

    def run(self, q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
            out: Optional[ArrayLike] = None, workspace: Optional[ArrayLike] = None, sm_scale: Optional[float] = None,
            *, sliding_window: Optional[int] = None, stream: Any = None):
        """Decode one layer with this plan; arguments as :func:`decode`. ``workspace``
        (float32, >= workspace_bytes) defaults to the planner's own. ``sliding_window``:
        the layer's window (default the planner's): one plan serves a model mixing
        full and windowed layers (the window only tunes the split count). Returns out."""
        view = _as_view(cache)
        lay = view.layout
        if (lay.format != self.layout.format or lay.block_size != self.layout.block_size
                or lay.num_kv_heads != self.layout.num_kv_heads or lay.head_dim != self.layout.head_dim):
            raise ValueError(f"'cache': layout {lay!r} does not match the planner's {self.layout!r} "
                             "(format, block_size, num_kv_heads, head_dim)")
        _require_array(q, "q")
        qdev = _device_of(q)
        want = _DLPACK_CPU if self._device[0] == "cpu" else _DLPACK_CUDA
        if qdev[0] != want or (want == _DLPACK_CUDA and qdev[1] != self._device[1]):
            got = "cpu" if qdev[0] == _DLPACK_CPU else (f"cuda:{qdev[1]}" if qdev[0] == _DLPACK_CUDA
                                                         else f"DLPack device {qdev}")
            raise ValueError(f"'q' is on {got}; expected {self.device} (the planner's device)")
        n = int(getattr(q, "shape", (0,))[0])
        if n > self.num_seqs:
            raise ValueError(f"'q': {n} sequences; expected at most num_seqs = {self.num_seqs} (the planner's)")
        if workspace is None:
            workspace = self.workspace
        if self.workspace_bytes > 0 and workspace is None:
            raise ValueError(f"'workspace': required (num_splits = {self.num_splits} merged through it, "
                             f">= {self.workspace_bytes} bytes float32)")
        view, hq, D, block_tables, seq_lens = _decode_inputs(q, view, block_tables, seq_lens, self.num_q_heads)
        out = _decode_out(q, out, hq, D)
        if workspace is not None:
            _require_array(workspace, "workspace")
        window = self.sliding_window if sliding_window is None else _check_window(sliding_window)
        _metrale.run_decode(self.plan, _dl(q), view.layout, _dl(view.k), _dl(view.v), view.scales,
                            _dl(block_tables), _dl(seq_lens), _sm_scale(sm_scale, D), _dl(out),
                            None if workspace is None else _dl(workspace), window, _stream_handle(q, stream))
        return out

    def attend(self, q: ArrayLike, cache: KVCacheView, q_start: ArrayLike, block_tables: ArrayLike,
               seq_lens: ArrayLike, out: Optional[ArrayLike] = None, workspace: Optional[ArrayLike] = None,
               sm_scale: Optional[float] = None, *, sinks: Optional[ArrayLike] = None, softcap: float = 0.0,
               lse: Optional[ArrayLike] = None, stream: Any = None):
        """Query runs with this plan (``run_attn``); arguments as :func:`attend`. Plan with
        ``max_q_len`` >= every run (and ``attn_options=True`` for sinks, soft-cap or lse). Returns out."""
        if not self.plan.runs_kernel:
            raise ValueError("'q_start': this Planner made a decode plan (max_q_len=1, attn_options=False); "
                             "make it with max_q_len >= the longest run (or attn_options=True) to attend "
                             "query runs, or call run() for one row per sequence")
        view = _as_view(cache)
        if workspace is None:
            workspace = self.workspace
        view, hq, D, block_tables, seq_lens = _decode_inputs(q, view, block_tables, seq_lens, self.num_q_heads)
        _require_array(q_start, "q_start")
        q_start = _int32_index(q_start, "q_start")
        out = _decode_out(q, out, hq, D)
        _metrale.attend(self.plan, _dl(q), hq, view.layout, _dl(view.k), _dl(view.v), view.scales, _dl(q_start),
                        _dl(block_tables), _dl(seq_lens), self.sliding_window, _sm_scale(sm_scale, D),
                        None if sinks is None else _dl(sinks), _check_softcap(softcap), _dl(out),
                        None if lse is None else _dl(lse), None if workspace is None else _dl(workspace),
                        int(self.plan.max_q_len), _stream_handle(q, stream))
        return out

    def __repr__(self) -> str:
        return (f"Planner(num_seqs={self.num_seqs}, num_q_heads={self.num_q_heads}, max_seq_len={self.max_seq_len}, "
                f"sliding_window={self.sliding_window}, device={self.device!r}, plan={self.plan!r})")
