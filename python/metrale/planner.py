"""Planner: the split plan of one decode batch shape, made once and reused for every layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from . import _metrale
from ._metrale import KvCacheLayout
from ._arrays import _DLPACK_CPU, _DLPACK_CUDA, ArrayLike, _device_of, _empty, _parse_device, _require_array
from .ops import _check_window, _decode
from .view import KVCacheView, _as_view, _layout_of

if TYPE_CHECKING:
    from .cache import PagedKVCache


class Planner:
    """Split plan for one decode batch shape, made once and reused for every layer.

    ``Planner(num_seqs, num_q_heads, layout, max_seq_len, sliding_window=0, device="cpu")``
    picks single pass or split-K and ``num_splits`` from the batch and the
    target (the GPU's SM count on CUDA, the thread count on CPU), and owns a
    split-K workspace of ``workspace_bytes`` on `device` (allocated once here,
    never in ``run``). ``run`` enqueues the decode (split-K + reduce when
    ``num_splits > 1``) without synchronising or allocating when ``out`` is
    given, so it can be captured in a CUDA graph. A batch of up to
    ``num_seqs`` sequences and any lengths may run on one plan (the plan is a
    performance choice, not a correctness one).
    """

    def __init__(self, num_seqs: int, num_q_heads: int, layout: Union[KvCacheLayout, KVCacheView, "PagedKVCache"],
                 max_seq_len: int, sliding_window: int = 0, device: Any = "cpu", *, allocate_workspace: bool = True):
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
        if self._device[0] == "cpu":
            num_sms = int(_metrale.cpu_num_threads())
        else:
            num_sms = int(_metrale.cuda_device_info(self._device[1])[1])
        self.num_sms = num_sms
        self.num_splits, self.workspace_bytes = (int(x) for x in _metrale.plan_decode(
            self.num_seqs, self.num_q_heads, layout, self.max_seq_len, self.sliding_window, num_sms))
        self.workspace = None
        if allocate_workspace and self.num_splits > 1:
            self.workspace = _empty(((self.workspace_bytes + 3) // 4,), "float32", self._device)

    @property
    def device(self) -> str:
        return "cpu" if self._device[0] == "cpu" else f"cuda:{self._device[1]}"

    def run(self, q: ArrayLike, cache: KVCacheView, block_tables: ArrayLike, seq_lens: ArrayLike,
            out: Optional[ArrayLike] = None, workspace: Optional[ArrayLike] = None, sm_scale: Optional[float] = None,
            *, stream: Any = None):
        """Decode one layer with this plan; arguments as :func:`decode`. ``workspace``
        (float32, >= workspace_bytes) defaults to the planner's own. Returns out."""
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
        if self.num_splits > 1 and workspace is None:
            raise ValueError(f"'workspace': required (num_splits = {self.num_splits}, "
                             f">= {self.workspace_bytes} bytes float32)")
        return _decode(2, q, view, block_tables, seq_lens, out, workspace, self.num_splits, self.sliding_window,
                       sm_scale, self.num_q_heads, stream)

    def __repr__(self) -> str:
        return (f"Planner(num_seqs={self.num_seqs}, num_q_heads={self.num_q_heads}, max_seq_len={self.max_seq_len}, "
                f"sliding_window={self.sliding_window}, device={self.device!r}, num_splits={self.num_splits}, "
                f"workspace_bytes={self.workspace_bytes})")
