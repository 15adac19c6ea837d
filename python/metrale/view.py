"""KVCacheView: one layer's K and V caches as the operations take them."""

from __future__ import annotations

from typing import Any, Optional, Tuple


from . import _metrale
from ._metrale import KvCacheLayout, KvFormat
from ._arrays import ArrayLike, _require_array

# The order of the per-tensor scales wherever they travel as a tuple (the extension's).
SCALE_NAMES: Tuple[str, ...] = tuple(_metrale.KV_SCALE_NAMES)
_SCALE_INDEX = {name: i for i, name in enumerate(SCALE_NAMES)}


def tensor_scale_names(format: KvFormat) -> Tuple[str, ...]:
    """The names of the two per-tensor scales `format` takes (K's, V's); () for bf16."""
    return tuple(_metrale.kv_tensor_scale_names(format))


def scales_of(format: KvFormat, k_scale: float, v_scale: float) -> Tuple[float, float, float, float]:
    """The four scales (SCALE_NAMES order) of a cache of `format` whose two per-tensor scales
    are k_scale and v_scale (FP8's scales, NVFP4's global scales; the others 1)."""
    s = [1.0] * len(SCALE_NAMES)
    names = tensor_scale_names(format)
    if names:
        s[_SCALE_INDEX[names[0]]], s[_SCALE_INDEX[names[1]]] = float(k_scale), float(v_scale)
    return tuple(s)  # type: ignore[return-value]


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
        given = {"k_scale": k_scale, "v_scale": v_scale, "k_global_scale": k_global_scale,
                 "v_global_scale": v_global_scale}
        self._s = _scales if _scales is not None else [float(given[n]) for n in SCALE_NAMES]

    k_scale = property(lambda self: self._get("k_scale"), lambda self, x: self._set("k_scale", x))
    v_scale = property(lambda self: self._get("v_scale"), lambda self, x: self._set("v_scale", x))
    k_global_scale = property(lambda self: self._get("k_global_scale"), lambda self, x: self._set("k_global_scale", x))
    v_global_scale = property(lambda self: self._get("v_global_scale"), lambda self, x: self._set("v_global_scale", x))

    def _get(self, name: str) -> float:
        return self._s[_SCALE_INDEX[name]]

    def _set(self, name: str, x: float) -> None:
        self._s[_SCALE_INDEX[name]] = float(x)

    @property
    def scales(self) -> Tuple[float, float, float, float]:
        """The four per-tensor scales in SCALE_NAMES order (k_scale, v_scale, k_global_scale,
        v_global_scale)."""
        return tuple(self._s)  # type: ignore[return-value]

    @property
    def tensor_scales(self) -> Tuple[float, float]:
        """The two scales the format takes (FP8 k/v_scale, NVFP4 k/v_global_scale; bf16: 1, 1)."""
        names = tensor_scale_names(self.layout.format)
        return (self._get(names[0]), self._get(names[1])) if names else (1.0, 1.0)

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
