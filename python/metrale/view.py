"""KVCacheView: one layer's K and V caches as the operations take them."""

from __future__ import annotations

from typing import Any, Optional, Tuple


from ._metrale import KvCacheLayout, KvFormat
from ._arrays import ArrayLike, _require_array


class KVCacheView:
    """One layer's K and V caches: a layout, two buffers and the per-tensor scales.

    ``k`` and ``v`` are C-contiguous buffers of at least ``layout.cache_bytes``
    bytes each (any dtype; 16-byte aligned), both on one device. Scales:
    FP8 ``k_scale`` / ``v_scale`` (x = code * scale); NVFP4 ``k_global_scale``
    / ``v_global_scale`` (x = e2m1 * group scale * global scale). BF16 ignores
    them. ``PagedKVCache.layer(i)`` returns views whose scales follow the
    cache's (calibration updates them).
    """

    __slots__ = ("layout", "k", "v", "_s")

    def __init__(self, layout: KvCacheLayout, k: ArrayLike, v: ArrayLike, *, k_scale: float = 1.0,
                 v_scale: float = 1.0, k_global_scale: float = 1.0, v_global_scale: float = 1.0,
                 _scales: Optional[list] = None):
        if not isinstance(layout, KvCacheLayout):
            raise TypeError(f"'layout': expected a metrale.KvCacheLayout, got {type(layout).__name__}")
        _require_array(k, "k")
        _require_array(v, "v")
        self.layout = layout
        self.k = k
        self.v = v
        self._s = _scales if _scales is not None else [float(k_scale), float(v_scale), float(k_global_scale),
                                                       float(v_global_scale)]

    k_scale = property(lambda self: self._s[0], lambda self, x: self._s.__setitem__(0, float(x)))
    v_scale = property(lambda self: self._s[1], lambda self, x: self._s.__setitem__(1, float(x)))
    k_global_scale = property(lambda self: self._s[2], lambda self, x: self._s.__setitem__(2, float(x)))
    v_global_scale = property(lambda self: self._s[3], lambda self, x: self._s.__setitem__(3, float(x)))

    @property
    def scales(self) -> Tuple[float, float, float, float]:
        """(k_scale, v_scale, k_global_scale, v_global_scale)."""
        return tuple(self._s)  # type: ignore[return-value]

    @property
    def format(self) -> KvFormat:
        return self.layout.format

    def __repr__(self) -> str:
        return f"KVCacheView({self.layout!r}, scales={self.scales})"


def _as_view(cache: Any, name: str = "cache") -> KVCacheView:
    if isinstance(cache, KVCacheView):
        return cache
    if hasattr(cache, "num_layers") and hasattr(cache, "layer"):  # a PagedKVCache
        if cache.num_layers == 1:
            return cache.layer(0)
        raise TypeError(f"'{name}': this PagedKVCache has {cache.num_layers} layers; pass cache.layer(i)")
    raise TypeError(f"'{name}': expected a metrale.KVCacheView (e.g. PagedKVCache.layer(i)), "
                    f"got {type(cache).__name__}")



def _layout_of(x: Any) -> KvCacheLayout:
    """The layout of a KvCacheLayout, a KVCacheView or a PagedKVCache."""
    return x.layout if isinstance(getattr(x, "layout", None), KvCacheLayout) else x
