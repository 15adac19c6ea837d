"""Calibrator (running absmax -> scales) and PagedKVCache (a multi-layer paged cache allocation)."""

from __future__ import annotations

import math
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _metrale
from ._metrale import KvFormat
from ._arrays import (ArrayLike, _device_of, _dl, _empty, _format, format_name, _is_cuda, _parse_device, _require_array,
                      _stream_handle, make_layout)
from .ops import reshape_and_cache
from .view import SCALE_NAMES, KVCacheView, tensor_scale_names


class Calibrator:
    """Running absmax of K and of V over calibration batches (docs/spec.md 1).

    ``observe(key, value)`` folds max|x| of a batch of bf16 rows into the
    running values with ``bf16_absmax``; on CUDA the running values stay on
    the device (no synchronisation) until ``absmax`` / the scales are read.
    """

    def __init__(self) -> None:
        self._cpu = np.zeros(2, dtype=np.float32)
        self._dev: Any = None  # float32[2] on a CUDA device, once a CUDA batch is observed

    def observe(self, key: ArrayLike, value: ArrayLike, *, stream: Any = None) -> None:
        _require_array(key, "key")
        _require_array(value, "value")
        if _is_cuda(key):
            if self._dev is None:
                self._dev = _empty((2,), "float32", ("cuda", _device_of(key)[1]), zero=True)
            s = _stream_handle(key, stream)
            _metrale.bf16_absmax(_dl(key), _dl(self._dev[0:1]), s, "key")
            _metrale.bf16_absmax(_dl(value), _dl(self._dev[1:2]), s, "value")
        else:
            _metrale.bf16_absmax(key, self._cpu[0:1], 0, "key")
            _metrale.bf16_absmax(value, self._cpu[1:2], 0, "value")

    def reset(self) -> None:
        self._cpu[:] = 0
        if self._dev is not None:
            self._dev.zero_()

    @property
    def absmax(self) -> Tuple[float, float]:
        """(absmax of K, absmax of V) seen so far (reads device values back: synchronises)."""
        k, v = float(self._cpu[0]), float(self._cpu[1])
        if self._dev is not None:
            d = self._dev.cpu().tolist() if hasattr(self._dev, "cpu") else list(self._dev)
            k, v = max(k, float(d[0])), max(v, float(d[1]))
        return (k, v)

    def scales(self, format: Union[str, KvFormat]) -> dict:
        """The scales of a cache of `format` from the absmax seen so far (the C++
        kv_scales_from_absmax rule): {name: value} of the format's two per-tensor scales."""
        return kv_scales_from_absmax(format, *self.absmax)


def kv_scales_from_absmax(format: Union[str, KvFormat], k_absmax: float, v_absmax: float) -> dict:
    """The per-tensor scales of `format` calibrated from the absmax of K and of V
    (x = absmax / the format's largest value; an absmax of 0 gives 1): {name: value} of the
    two scales the format takes (FP8 k_scale / v_scale, NVFP4 k_global_scale /
    v_global_scale; bf16: {})."""
    fmt = _format(format)
    s = _metrale.kv_scales_from_absmax(fmt, float(k_absmax), float(v_absmax))
    return {name: float(s[SCALE_NAMES.index(name)]) for name in tensor_scale_names(fmt)}


class PagedKVCache:
    """K and V paged caches of one format for `num_layers` layers.

    Buffers are zero-initialised uint8 arrays of shape
    ``(num_blocks, layout.page_stride_bytes)``, one K and one V per layer,
    allocated with NumPy (``device="cpu"``) or torch (``device="cuda"``).
    ``layer(i)`` (or ``cache[i]``) is the KVCacheView the operations take.
    Scales are per layer: FP8 ``k_scale`` / ``v_scale``, NVFP4
    ``k_global_scale`` / ``v_global_scale``, set by ``set_scales`` or by
    ``calibrate``. Write scales before writing tokens: the cache stores codes
    quantised with the scales in force at write time.
    Every ``write`` counts, per layer, the K and V elements that exceeded the
    calibrated range and were clipped (``saturated``; no synchronisation on
    the write path), as ``skipped`` counts out-of-capacity slots.
    """

    def __init__(self, format: Union[str, KvFormat], num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, num_layers: int = 1, device: Any = "cpu", *, cache_stride: int = 0,
                 block_stride_bytes: int = 0, data_section_bytes: int = 0, k_scale: float = 1.0,
                 v_scale: float = 1.0, k_global_scale: float = 1.0, v_global_scale: float = 1.0,
                 nvfp4_scales: str = "max6"):
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"'num_layers' = {num_layers!r}; expected an int >= 1")
        self.layout = make_layout(format, num_blocks, block_size, num_kv_heads, head_dim, cache_stride=cache_stride,
                                  block_stride_bytes=block_stride_bytes, data_section_bytes=data_section_bytes,
                                  nvfp4_scales=nvfp4_scales)
        self.num_layers = num_layers
        self._device = _parse_device(device)
        shape = (num_layers, 2, self.layout.num_blocks, self.layout.page_stride_bytes)
        self._buf = _empty(shape, "uint8", self._device, zero=True)
        given = {"k_scale": k_scale, "v_scale": v_scale, "k_global_scale": k_global_scale,
                 "v_global_scale": v_global_scale}
        self._scales = [[float(given[n]) for n in SCALE_NAMES] for _ in range(num_layers)]
        self._calib = [Calibrator() for _ in range(num_layers)]
        self._saturated = _empty((num_layers, 2), "int64", self._device, zero=True)  # per layer: K, V elements
        self._written = [False] * num_layers  # a layer holds tokens: its scales are fixed

    # ---- shape & sizes
    @property
    def format(self) -> KvFormat:
        return self.layout.format

    @property
    def device(self) -> str:
        return "cpu" if self._device[0] == "cpu" else f"cuda:{self._device[1]}"

    @property
    def capacity(self) -> int:
        """Token slots per layer (num_blocks * block_size)."""
        return int(self.layout.capacity_slots)

    @property
    def bytes_per_token(self) -> float:
        """Bytes of K+V codes and scales one token occupies over all layers (no page padding)."""
        return self.layout.kv_bytes_per_token * self.num_layers

    @property
    def bytes_per_token_per_layer(self) -> float:
        return float(self.layout.kv_bytes_per_token)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for all K and V buffers."""
        return int(self.layout.cache_bytes) * 2 * self.num_layers

    # ---- buffers & views
    def _check_layer(self, layer: int) -> int:
        if not isinstance(layer, (int, np.integer)) or isinstance(layer, bool) or not 0 <= layer < self.num_layers:
            raise ValueError(f"'layer' = {layer!r}; expected an int in [0, {self.num_layers})")
        return int(layer)

    def k(self, layer: int):
        """K buffer of `layer`: uint8 (num_blocks, page_stride_bytes)."""
        return self._buf[self._check_layer(layer), 0]

    def v(self, layer: int):
        """V buffer of `layer`: uint8 (num_blocks, page_stride_bytes)."""
        return self._buf[self._check_layer(layer), 1]

    def layer(self, layer: int) -> KVCacheView:
        """The KVCacheView of `layer` (shares buffers and scales with the cache)."""
        i = self._check_layer(layer)
        return KVCacheView(self.layout, self._buf[i, 0], self._buf[i, 1], _scales=self._scales[i])

    def __getitem__(self, layer: int) -> KVCacheView:
        return self.layer(layer)

    def __len__(self) -> int:
        return self.num_layers

    def __iter__(self):
        return (self.layer(i) for i in range(self.num_layers))

    # ---- scales
    def scales(self, layer: int = 0) -> dict:
        """{'k_scale', 'v_scale', 'k_global_scale', 'v_global_scale'} of `layer`."""
        s = self._scales[self._check_layer(layer)]
        return dict(zip(SCALE_NAMES, s))

    def _check_unwritten(self, layers, force: bool, what: str) -> None:
        """Scales give the cached codes their meaning: changing them after a write
        would silently change every token already in the layer."""
        if force:
            return
        for i in layers:
            if self._written[i]:
                raise ValueError(f"'layer' = {i}: {what} after tokens were written would change the meaning of "
                                 "the cached codes; set the scales before the first write (calibrate from the "
                                 "prompt), or pass force=True after rewriting the layer")

    def set_scales(self, layer: Optional[int] = None, *, k_scale: Optional[float] = None,
                   v_scale: Optional[float] = None, k_global_scale: Optional[float] = None,
                   v_global_scale: Optional[float] = None, force: bool = False) -> None:
        """Sets the given scales of `layer` (all layers when None); each must be finite and at
        least the format's smallest tensor scale (FP8: 2^-126, the smallest normal f32, whose
        reciprocal the write takes; NVFP4: any positive g).
        Refused on a layer that holds tokens unless ``force``."""
        layers = range(self.num_layers) if layer is None else [self._check_layer(layer)]
        given = []
        values = {"k_scale": k_scale, "v_scale": v_scale, "k_global_scale": k_global_scale,
                  "v_global_scale": v_global_scale}
        least = float(_metrale.kv_min_tensor_scale(self.format))
        for idx, name in enumerate(SCALE_NAMES):
            val = values[name]
            if val is None:
                continue
            if isinstance(val, (bool, np.bool_)) or not (isinstance(val, (int, float, np.integer, np.floating))
                                                         and math.isfinite(val) and val > 0 and val >= least):
                floor = f" >= {least:g} (the format's smallest tensor scale: 1 / scale finite)" if least > 0 else ""
                raise ValueError(f"'{name}' = {val!r}; expected a finite float > 0{floor}")
            given.append((idx, float(val)))
        self._check_unwritten(layers, force, "setting scales")
        for idx, val in given:
            for i in layers:
                self._scales[i][idx] = val

    def calibrate(self, key: ArrayLike, value: ArrayLike, layer: Optional[int] = None, *,
                  stream: Any = None, force: bool = False) -> dict:
        """Folds a calibration batch of bf16 K and V rows into the running absmax of
        `layer` (every layer when None) and sets that layer's scales from it:
        FP8 ``k_scale = absmax_k / 448``; NVFP4 ``k_global_scale = absmax_k /
        (448 * 6)`` (the same for V); BF16 has none. On CUDA this reads the
        absmax back (synchronises); calibration is not part of the decode path.
        Returns the scales of the (first) calibrated layer.

        Policy: calibrate each layer from its prompt's K and V before the first
        write; the scales then stay fixed for the cache's life (values past the
        calibrated range saturate at the format's largest code, and are
        counted: ``saturated``). Calibrating a layer that holds tokens is
        refused unless ``force`` (after which the caller rewrites the layer).
        key, value: as :func:`bf16_absmax` takes them (any strided view whose
        last dimension is contiguous, e.g. transformers' ``key[:, :, -1]``).
        """
        layers = range(self.num_layers) if layer is None else [self._check_layer(layer)]
        self._check_unwritten(layers, force, "re-calibrating")
        for i in layers:
            c = self._calib[i]
            c.observe(key, value, stream=stream)
            self._set_calibrated(i, c.scales(self.format))
        return self.scales(layers[0])

    def calibrate_from_absmax(self, layer: int, k_absmax: float, v_absmax: float, *, force: bool = False) -> dict:
        """Sets the scales of `layer` from an absmax of K and of V measured elsewhere (the rule
        of :func:`kv_scales_from_absmax`); refused on a layer that holds tokens unless
        ``force``. Returns the layer's scales."""
        i = self._check_layer(layer)
        self._check_unwritten([i], force, "re-calibrating")
        self._set_calibrated(i, kv_scales_from_absmax(self.format, k_absmax, v_absmax))
        return self.scales(i)

    def _set_calibrated(self, layer: int, scales: dict) -> None:
        for name, val in scales.items():
            self._scales[layer][SCALE_NAMES.index(name)] = val

    def reset_calibration(self) -> None:
        for c in self._calib:
            c.reset()

    def mark_written(self, layer: int) -> None:
        """Records that `layer` holds tokens written outside :meth:`write` (e.g. through
        ``torch.ops.metrale.reshape_and_cache``): its scales are fixed from now on."""
        self._written[self._check_layer(layer)] = True

    def forget_tokens(self) -> None:
        """Forgets that the layers hold tokens (the pages are not cleared) and the running
        calibration absmax: the next batch calibrates and writes afresh."""
        self._written = [False] * self.num_layers
        self.reset_calibration()

    # ---- writes
    def write(self, layer: int, key: ArrayLike, value: ArrayLike, slot_mapping: ArrayLike, *,
              skipped: Optional[ArrayLike] = None, stream: Any = None) -> Optional[int]:
        """reshape_and_cache into `layer`; see :func:`reshape_and_cache` (key and
        value may be head-strided views such as transformers' ``key[:, :, -1]``
        or a ``(batch, heads, seq, head_dim)`` tensor: no copy). Saturated
        elements are added to the layer's counters (``saturated``)."""
        i = self._check_layer(layer)
        r = reshape_and_cache(key, value, slot_mapping, self.layer(i), skipped=skipped,
                              saturated=self._saturated[i], stream=stream)
        self._written[i] = True
        return r

    # ---- saturation counts
    def saturated(self, layer: Optional[int] = None) -> Tuple[int, int]:
        """(K, V) elements the writes into `layer` (all layers when None) clipped
        since the cache was made or ``reset_saturated``: values past the
        calibrated range (FP8 ``|x| / scale > 464``, NVFP4 ``|x| / (6 g) > 464``,
        past the rounding interval of the largest code 448; BF16 never). Reads the counters back (synchronises on CUDA): poll it off
        the decode path, e.g. once per step or per request; see
        docs/numerics.md for what to do when it grows."""
        c = self._saturated if layer is None else self._saturated[self._check_layer(layer)]
        a = np.asarray(c.cpu() if hasattr(c, "cpu") else c).reshape(-1, 2).sum(axis=0)
        return (int(a[0]), int(a[1]))

    @property
    def saturation_counters(self):
        """The int64 ``(num_layers, 2)`` counters (K, V) on the cache's device, as
        the writes leave them (no synchronisation: read or snapshot them on
        your own stream, e.g. inside a captured graph)."""
        return self._saturated

    def reset_saturated(self, layer: Optional[int] = None) -> None:
        """Zeroes the saturation counters of `layer` (all layers when None)."""
        c = self._saturated if layer is None else self._saturated[self._check_layer(layer)]
        if hasattr(c, "zero_"):
            c.zero_()
        else:
            c[...] = 0

    def __repr__(self) -> str:
        return (f"PagedKVCache(format={format_name(self.format)!r}, layers={self.num_layers}, "
                f"device={self.device!r}, {self.layout!r})")
