"""Planner: the attention plan of one batch shape, made once and reused for every layer."""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

import numpy as np

from . import _metrale
from ._metrale import AttnPlan, KvCacheLayout
from ._arrays import (_DLPACK_CPU, _DLPACK_CUDA, MAX_SPLITS, ArrayLike, _device_of, _dl, _empty, _is_cuda,
                      _parse_device, _require_array, _require_writable, _stream_handle, _torch_for_cuda)
from .view import KVCacheView, _as_view, _layout_of

if TYPE_CHECKING:
    from .cache import PagedKVCache

MERGES = ("automatic", "single_pass", "cluster", "workspace", "states_only")
# The workspace bound of a plan made with max_workspace_bytes=0.
DEFAULT_MAX_WORKSPACE_BYTES: int = int(_metrale.default_max_workspace_bytes())


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


def _q_shape(q: Any, head_dim: int, num_q_heads: Optional[int]) -> Tuple[int, int]:
    """(rows, q heads) of a query array in the shapes the extension takes: (rows, H, D),
    (rows, H*D), (batch, H, 1, D), (batch, 1, H, D) and (1, H, tokens, D)."""
    shape = tuple(int(x) for x in getattr(q, "shape", ()))
    if num_q_heads is not None:
        num_q_heads = _check_int("num_q_heads", num_q_heads, 1, what=" (None: from q's shape)")
    if len(shape) == 3:
        return shape[0], int(num_q_heads) if num_q_heads is not None else shape[1]
    if len(shape) == 2 and head_dim > 0:
        if num_q_heads is not None:
            return shape[0], int(num_q_heads)
        if shape[1] % head_dim == 0:
            return shape[0], shape[1] // head_dim
    if len(shape) == 4:
        hq = num_q_heads
        if hq is None:
            hq = shape[1] if shape[2] == 1 else (shape[2] if shape[1] == 1 else shape[1])
        if shape[1] == hq and shape[2] == 1 or shape[1] == 1 and shape[2] == hq:
            return shape[0], int(hq)
        if shape[0] == 1 and shape[1] == hq:
            return shape[2], int(hq)
    raise ValueError(f"'q': expected shape (rows, num_q_heads, {head_dim}), (rows, num_q_heads * {head_dim}), "
                     f"(batch, num_q_heads, 1, {head_dim}), (batch, 1, num_q_heads, {head_dim}) or "
                     f"(1, num_q_heads, rows, {head_dim}), got {shape}")


def _empty_like_q(q: Any, shape: Tuple[int, ...], dtype: str):
    """An output of q's array type: torch for a torch q (CPU or CUDA), else NumPy
    (bf16 as uint16 bit patterns)."""
    if _is_cuda(q):
        torch = _torch_for_cuda("metrale: out=None")
        return torch.empty(shape, dtype=getattr(torch, dtype), device=q.device)
    torch = sys.modules.get("torch")  # never imported here: only when the caller passes its tensors
    if torch is not None and isinstance(q, torch.Tensor):
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, dtype=np.uint16 if dtype == "bfloat16" else np.float32)


def _check_float(name: str, val: Any, what: str, nonnegative: bool = False) -> float:
    """A finite real number (a Python or NumPy int or float; not a bool or a string)."""
    if not isinstance(val, (int, float, np.integer, np.floating)) or isinstance(val, (bool, np.bool_)):
        raise TypeError(f"'{name}': expected {what}, got {type(val).__name__} {val!r}")
    f = float(val)
    if not math.isfinite(f) or (nonnegative and f < 0):
        raise ValueError(f"'{name}' = {val!r}; expected {what}")
    return f


def _sm_scale(sm_scale: Optional[float], head_dim: int) -> float:
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    return _check_float("sm_scale", sm_scale, "a finite float")


def _check_window(sliding_window: Any) -> int:
    return _check_int("sliding_window", sliding_window, 0, what=" (0 = off)")


def _check_softcap(softcap: Any) -> float:
    return _check_float("softcap", softcap, "a finite float >= 0 (0 = off)", nonnegative=True)


def _check_int(name: str, val: Any, lo: int, hi: Optional[int] = None, what: str = "") -> int:
    if not isinstance(val, (int, np.integer)) or isinstance(val, bool) or val < lo or (hi is not None and val > hi):
        bound = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
        raise ValueError(f"'{name}' = {val!r}; expected {bound}{what}")
    return int(val)


def _int32_index(x: Any, name: str) -> Any:
    """Block tables, lengths and q_start are int32 on both backends. An int64 host
    array (NumPy's and torch's default) is converted here, a copy as small as the
    table; a CUDA one must be int32 already (a conversion there would allocate in
    the step: convert once, when the table is built)."""
    if isinstance(x, np.ndarray) and x.dtype == np.int64:
        if x.size and (int(x.max()) > 2**31 - 1 or int(x.min()) < -2**31):
            raise ValueError(f"'{name}': int64 values outside int32's range")
        return x.astype(np.int32)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and not x.is_cuda and x.dtype == torch.int64:
        return _int32_index(x.numpy(), name)
    return x


def _host_values(x: Any) -> Optional[np.ndarray]:
    """The values of a host index array (NumPy or torch CPU), None for a device one."""
    if isinstance(x, np.ndarray):
        return x
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and not x.is_cuda:
        return x.numpy()
    return None


class Planner:
    """The attention plan of one batch shape, made once and reused for every layer.

    ``Planner(num_seqs, num_q_heads, layout, max_seq_len, sliding_window=0, device=None, *,
    max_q_len=1, num_q_rows=0, query_runs=False, attn_options=False, num_splits=0,
    merge="automatic", max_workspace_bytes=0, allocate_workspace=True, runs_plan=True)``

    What the plan is made for (upper bounds): ``num_seqs`` sequences of at most
    ``max_seq_len`` positions, query runs of at most ``max_q_len`` rows (1: decode)
    and ``num_q_rows`` rows in all (0: ``num_seqs * max_q_len``); ``query_runs``:
    the rows come as runs (``q_start``) even where all have one row;
    ``attn_options``: sinks, soft-cap or lse will be asked for. device None: the
    cache's when `layout` is a PagedKVCache or a view, else the CPU.

    Options a caller decides instead of the planner: ``num_splits`` (0: the
    planner's; 1: single pass; up to MAX_SPLITS), ``merge`` ("automatic",
    "single_pass", "cluster", "workspace", or "states_only": the run writes the
    split-K states to the workspace and stops, for :func:`reduce_states`),
    ``max_workspace_bytes`` (0: the default bound, 4 GiB): a forced split count
    whose workspace passes it raises ValueError naming the bytes, before anything
    is allocated; the planner's own split count stays within it, and a long
    FP8 / NVFP4 prefill stages its pages as bf16 in the workspace only within
    half of it (docs/prefill.md).

    ``self.plan`` is the :class:`AttnPlan` (``kernel``: "decode", "query_runs" or
    "prefill"; ``num_splits``; ``merge``; ``workspace_bytes``). Where it is a decode
    plan, ``self.runs_plan`` is the plan of the same problem as query runs with
    sinks, soft-cap and lse (``runs_plan=False`` leaves it out, None), which
    ``run`` takes for a ``q_start`` (runs of at most one row: an engine's mixed
    step) or those options. The planner owns the workspace its plans need (split-K
    records, a staged prefill's bf16 pages) on `device` (allocated once here, never in ``run``; ``allocate_workspace=False``
    leaves that to the caller). ``run`` enqueues what the plan says without
    synchronising or allocating when ``out`` is given, so it can be captured in a
    CUDA graph. Any batch that fits the plan runs on it (at most num_seqs
    sequences, num_q_rows rows, runs of at most max_q_len rows, any lengths): the
    plan is a performance choice, not a correctness one.
    """

    def __init__(self, num_seqs: int, num_q_heads: int, layout: Union[KvCacheLayout, KVCacheView, "PagedKVCache"],
                 max_seq_len: int, sliding_window: int = 0, device: Any = None, *, max_q_len: int = 1,
                 num_q_rows: int = 0, query_runs: bool = False, attn_options: bool = False, num_splits: int = 0,
                 merge: str = "automatic", max_workspace_bytes: int = 0, allocate_workspace: bool = True,
                 runs_plan: bool = True):
        if device is None:  # the cache's device (a bare layout: the CPU)
            device = _cache_device(layout)
        layout = _layout_of(layout)
        if not isinstance(layout, KvCacheLayout):
            raise TypeError(f"'layout': expected a metrale.KvCacheLayout, got {type(layout).__name__}")
        self.num_seqs = _check_int("num_seqs", num_seqs, 0)
        self.num_q_heads = _check_int("num_q_heads", num_q_heads, 1)
        if self.num_q_heads % layout.num_kv_heads != 0:
            raise ValueError(f"'num_q_heads' = {num_q_heads}; expected a positive multiple of the cache's "
                             f"num_kv_heads = {layout.num_kv_heads} (GQA)")
        self.layout = layout
        self.max_seq_len = _check_int("max_seq_len", max_seq_len, 0)
        self.sliding_window = _check_window(sliding_window)
        self._device = _parse_device(device)
        _check_int("max_q_len", max_q_len, 1, what=" (1: decode)")
        _check_int("num_q_rows", num_q_rows, 0, what=" (0: num_seqs * max_q_len)")
        _check_int("num_splits", num_splits, 0, MAX_SPLITS, " (0: the planner's)")
        _check_int("max_workspace_bytes", max_workspace_bytes, 0, what=" (0: the default bound)")
        if not isinstance(merge, str):
            raise TypeError(f"'merge': expected a str (one of {', '.join(MERGES)}), got {type(merge).__name__}")
        device_index = -1 if self._device[0] == "cpu" else int(self._device[1])
        # The plan first: a refused forced choice raises before anything is allocated.
        def plan(options: bool, runs: bool) -> AttnPlan:
            return _metrale.plan_attention(self.num_seqs, self.num_q_heads, layout, self.max_seq_len,
                                           self.sliding_window, device_index, int(max_q_len), int(num_q_rows),
                                           options, runs, int(num_splits), merge, int(max_workspace_bytes))

        self.plan: AttnPlan = plan(bool(attn_options), bool(query_runs))
        self.runs_plan: Optional[AttnPlan] = None
        if runs_plan and self.plan.kernel == "decode":
            try:
                self.runs_plan = plan(True, True)
            except ValueError:  # a forced choice the runs kernel cannot take: decode calls only
                self.runs_plan = None
        self.workspace = None
        if allocate_workspace and self.workspace_bytes > 0:
            self.workspace = _empty(((self.workspace_bytes + 3) // 4,), "float32", self._device)

    @property
    def num_splits(self) -> int:
        return int(self.plan.num_splits)

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the workspace this planner's plans need (split-K records and a staged
        prefill's pages; the larger of the two plans')."""
        runs = 0 if self.runs_plan is None else int(self.runs_plan.workspace_bytes)
        return max(int(self.plan.workspace_bytes), runs)

    @property
    def device(self) -> str:
        return "cpu" if self._device[0] == "cpu" else f"cuda:{self._device[1]}"

    def _check_device(self, q: Any) -> None:
        qdev = _device_of(q)
        want = _DLPACK_CPU if self._device[0] == "cpu" else _DLPACK_CUDA
        if qdev[0] != want or (want == _DLPACK_CUDA and qdev[1] != self._device[1]):
            got = "cpu" if qdev[0] == _DLPACK_CPU else (f"cuda:{qdev[1]}" if qdev[0] == _DLPACK_CUDA
                                                         else f"DLPack device {qdev}")
            raise ValueError(f"'q' is on {got}; expected {self.device} (the planner's device: make the Planner from "
                             "the PagedKVCache or view, which carry their device, or pass device=)")

    def run(self, q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
            out: Optional[ArrayLike] = None, workspace: Optional[ArrayLike] = None, sm_scale: Optional[float] = None,
            *, q_start: Optional[ArrayLike] = None, sinks: Optional[ArrayLike] = None, softcap: float = 0.0,
            lse: Optional[ArrayLike] = None, return_lse: bool = False, sliding_window: Optional[int] = None,
            stream: Any = None):
        """Attention of one layer with this plan; arguments as :func:`metrale.attention`.
        ``workspace`` (float32, >= workspace_bytes) defaults to the planner's own.
        ``sliding_window``: the layer's window (default the planner's): one plan serves
        a model mixing full and windowed layers. Returns out, ``(out, lse)`` with
        ``return_lse``, or the workspace for a "states_only" plan."""
        view = _as_view(cache)
        lay = view.layout
        if (lay.format != self.layout.format or lay.block_size != self.layout.block_size
                or lay.num_kv_heads != self.layout.num_kv_heads or lay.head_dim != self.layout.head_dim):
            raise ValueError(f"'cache': layout {lay!r} does not match the planner's {self.layout!r} "
                             "(format, block_size, num_kv_heads, head_dim)")
        for a, n in ((q, "q"), (block_tables, "block_tables"), (seq_lens, "seq_lens")):
            _require_array(a, n)
        self._check_device(q)
        D = int(lay.head_dim)
        rows, hq = _q_shape(q, D, self.num_q_heads)
        plan = self.plan
        if plan.kernel == "decode" and (q_start is not None or sinks is not None or softcap or lse is not None
                                        or return_lse):
            if self.runs_plan is None:
                raise ValueError("'q_start' / 'sinks' / 'softcap' / 'lse': this Planner made a decode plan only "
                                 "(runs_plan=False, or its forced options do not fit the runs kernel); make it "
                                 "with query_runs=True or attn_options=True")
            plan = self.runs_plan
        if q_start is None and rows > self.num_seqs:
            raise ValueError(f"'q': {rows} rows (one per sequence); expected at most num_seqs = {self.num_seqs} "
                             "(the planner's)")
        if rows > plan.num_q_rows:
            raise ValueError(f"'q': {rows} rows; expected at most the plan's num_q_rows = {plan.num_q_rows}")
        states_only = plan.merge == "states_only"
        if workspace is None:
            workspace = self.workspace
        if plan.workspace_bytes > 0 and workspace is None:
            raise ValueError(f"'workspace': required (>= {plan.workspace_bytes} bytes float32: the split-K "
                             f"records of num_splits = {plan.num_splits} and a staged prefill's pages)")
        if workspace is not None:
            _require_writable(workspace, "workspace")
        if q_start is not None:
            _require_array(q_start, "q_start")
            q_start = _int32_index(q_start, "q_start")
        if sinks is not None:
            _require_array(sinks, "sinks")
        if not states_only:
            out = _empty_like_q(q, (rows, hq, D), "bfloat16") if out is None else out
            _require_writable(out, "out")
        if return_lse and lse is None:
            lse = _empty_like_q(q, (rows, hq), "float32")
        if lse is not None:
            _require_writable(lse, "lse")
        window = self.sliding_window if sliding_window is None else _check_window(sliding_window)
        _metrale.attention(plan, _dl(q), lay, _dl(view.k), _dl(view.v), view.scales,
                           None if q_start is None else _dl(q_start), _dl(_int32_index(block_tables, "block_tables")),
                           _dl(_int32_index(seq_lens, "seq_lens")), window, _sm_scale(sm_scale, D),
                           None if sinks is None else _dl(sinks), _check_softcap(softcap),
                           None if out is None or states_only else _dl(out), None if lse is None else _dl(lse),
                           None if workspace is None else _dl(workspace), _stream_handle(q, stream))
        if states_only:
            return workspace
        return (out, lse) if return_lse else out

    def __repr__(self) -> str:
        return (f"Planner(num_seqs={self.num_seqs}, num_q_heads={self.num_q_heads}, max_seq_len={self.max_seq_len}, "
                f"sliding_window={self.sliding_window}, device={self.device!r}, plan={self.plan!r})")
