"""metrale: paged KV-cache decode attention (BF16, FP8 E4M3, NVFP4 caches).

Python bindings of the metrale C++/CUDA library. Every operation takes
arrays through DLPack, ``__cuda_array_interface__`` or the buffer protocol
(torch, CuPy, JAX, Numba, NumPy), without copies:
arrays in host memory run on the CPU reference backend, CUDA arrays on the
CUDA backend (Hopper, sm_90a), enqueued on the caller's current stream.

Conventions
-----------
* **bf16 data**: ``torch.bfloat16`` tensors, or -- NumPy has no bfloat16 --
  ``uint16`` arrays holding bf16 bit patterns (``to_bf16`` / ``from_bf16``
  convert float32 <-> those patterns). uint16 is accepted on GPU too.
* **Streams**: CUDA work runs on ``stream=`` when given (an int handle, a
  ``torch.cuda.Stream`` or a CuPy stream); else, for torch tensors, on
  ``torch.cuda.current_stream()``; for CuPy arrays on CuPy's current stream;
  otherwise on the legacy default stream. torch is never imported by the
  decode path: the stream is looked up only when the arrays are torch
  tensors. Nothing in the decode path synchronises or allocates (given an
  ``out`` and, for split-K, a workspace), so a decode can be captured in a
  ``torch.cuda.CUDAGraph``.
* **Errors**: bad arguments raise ``ValueError`` (wrong shape, strides,
  alignment, device, GQA ratio, workspace size, unsupported head_dim /
  block_size) or ``TypeError`` (wrong dtype, not an array), naming the
  argument and what was expected; CUDA runtime failures raise ``CudaError``.

Quick tour::

    import numpy as np, metrale
    cache = metrale.PagedKVCache("fp8", num_blocks=64, block_size=16,
                                 num_kv_heads=8, head_dim=128, num_layers=2)
    cache.calibrate(key, value)                  # per-tensor FP8 scales
    cache.write(0, key, value, slot_mapping)     # reshape_and_cache
    plan = metrale.Planner(num_seqs, 32, cache.layout, max_seq_len)
    out = plan.run(q, cache.layer(0), block_tables, seq_lens)
"""

from __future__ import annotations

import math
import sys
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from . import _metrale
from ._metrale import CudaError, KvCacheLayout, KvFormat

__all__ = [
    "CudaError",
    "KvCacheLayout",
    "KvFormat",
    "KVCacheView",
    "PagedKVCache",
    "Planner",
    "Calibrator",
    "reshape_and_cache",
    "bf16_absmax",
    "fp8_scale_from_absmax",
    "nvfp4_global_scale_from_absmax",
    "make_layout",
    "decode",
    "decode_splitk",
    "decode_reduce",
    "splitk_workspace_bytes",
    "validate_block_tables",
    "cuda_available",
    "cpu_num_threads",
    "set_cpu_num_threads",
    "to_bf16",
    "from_bf16",
    "MAX_SPLITS",
]

__version__ = "0.1.0"

MAX_SPLITS: int = _metrale.max_splits()

_DLPACK_CPU = 1
_DLPACK_CUDA = 2

ArrayLike = Any  # an object exporting DLPack (__dlpack__) or the buffer protocol

_FORMATS = {
    "bf16": KvFormat.bf16,
    "bfloat16": KvFormat.bf16,
    "fp8": KvFormat.fp8_e4m3,
    "fp8_e4m3": KvFormat.fp8_e4m3,
    "e4m3": KvFormat.fp8_e4m3,
    "nvfp4": KvFormat.nvfp4,
}


# --------------------------------------------------------------------------
# helpers


def to_bf16(x: ArrayLike) -> np.ndarray:
    """float array -> uint16 bf16 bit patterns (round to nearest even; NaN stays NaN)."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def from_bf16(x: ArrayLike) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 array (exact)."""
    u = np.asarray(x)
    if u.dtype != np.uint16:
        raise TypeError(f"from_bf16: expected a uint16 array of bf16 bit patterns, got dtype {u.dtype}")
    return (u.astype(np.uint32) << 16).view(np.float32)


def _format(fmt: Union[str, KvFormat]) -> KvFormat:
    if isinstance(fmt, KvFormat):
        return fmt
    if isinstance(fmt, str) and fmt.lower() in _FORMATS:
        return _FORMATS[fmt.lower()]
    raise ValueError(f"'format' = {fmt!r}; expected one of 'bf16', 'fp8', 'nvfp4'")


def make_layout(
    format: Union[str, KvFormat],
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    cache_stride: int = 0,
    block_stride_bytes: int = 0,
    data_section_bytes: int = 0,
) -> KvCacheLayout:
    """The KvCacheLayout of one K (or V) cache of `format`, validated.

    ``cache_stride`` (fp8, elements per page) and ``block_stride_bytes`` /
    ``data_section_bytes`` (nvfp4) give padded pages; 0 means dense.
    """
    f = _format(format)
    if f == KvFormat.bf16:
        layout = KvCacheLayout.bf16(num_blocks, block_size, num_kv_heads, head_dim)
    elif f == KvFormat.fp8_e4m3:
        layout = KvCacheLayout.fp8(num_blocks, block_size, num_kv_heads, head_dim, cache_stride)
    else:
        layout = KvCacheLayout.nvfp4(num_blocks, block_size, num_kv_heads, head_dim, block_stride_bytes,
                                     data_section_bytes)
    layout.validate()
    return layout


def _is_array(x: Any) -> bool:
    if hasattr(x, "__dlpack__") or hasattr(x, "__cuda_array_interface__"):
        return True
    try:
        memoryview(x)
        return True
    except TypeError:
        return False


def _require_array(x: Any, name: str) -> None:
    if not _is_array(x):
        raise TypeError(
            f"'{name}': expected an array (NumPy, torch, CuPy, JAX: DLPack or buffer protocol), "
            f"got {type(x).__name__}")


def _require_writable(x: Any, name: str) -> None:
    _require_array(x, name)
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"'{name}': read-only NumPy array; expected a writable one")


def _has_cai(x: Any) -> bool:
    return not hasattr(x, "__dlpack__") and hasattr(x, "__cuda_array_interface__")


def _device_of(x: Any) -> Tuple[int, int]:
    """(DLPack device type, device id) of an array; host for buffer-protocol objects."""
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        if _has_cai(x):
            ptr = int(x.__cuda_array_interface__["data"][0])
            return (_DLPACK_CUDA, int(_metrale.cuda_pointer_device(ptr)))
        return (_DLPACK_CPU, 0)
    t, i = dev()
    return (int(t), int(i))


def _is_cuda(x: Any) -> bool:
    return _device_of(x)[0] == _DLPACK_CUDA


def _stream_handle(x: Any, stream: Any) -> int:
    """The CUDA stream handle to enqueue on, for work on array `x`."""
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr", "handle"):  # torch.cuda.Stream, cupy Stream, ...
            h = getattr(stream, attr, None)
            if isinstance(h, int):
                return h
        raise TypeError(f"'stream': expected an int handle, a torch.cuda.Stream or a CuPy stream, "
                        f"got {type(stream).__name__}")
    if not _is_cuda(x):
        return 0
    torch = sys.modules.get("torch")  # never imported here: only used when the caller already has
    if torch is not None and isinstance(x, torch.Tensor):
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def _dl(x: Any) -> Any:
    """What to hand the extension for array `x`.

    CUDA torch tensors are exported here with ``__dlpack__(stream=-1)`` (the
    DLPack "no synchronisation" request): a plain ``__dlpack__()`` makes
    recent torch order the legacy default stream after the current one with
    an event, which costs a cross-stream dependency and breaks CUDA-graph
    capture. Everything else goes as is (nanobind imports it by DLPack or the
    buffer protocol). Objects that only have ``__cuda_array_interface__``
    (Numba, ...) are wrapped without a copy (the interface's ``stream`` is not
    waited on: produce the data on the stream the operation runs on).
    """
    if _has_cai(x):
        return _metrale.from_cuda_array_interface(x)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor) and x.is_cuda:
        x = x.detach()
        try:
            return x.__dlpack__(stream=-1)
        except TypeError:  # a torch without the stream argument
            return torch.utils.dlpack.to_dlpack(x)
    return x


def _parse_device(device: Any) -> Tuple[str, int]:
    """'cpu' | 'cuda' | 'cuda:N' | torch.device -> ('cpu'|'cuda', index)."""
    s = str(device)
    if s == "cpu":
        return ("cpu", 0)
    if s == "cuda":
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return ("cuda", int(torch.cuda.current_device()))
        return ("cuda", 0)
    if s.startswith("cuda:") and s[5:].isdigit():
        return ("cuda", int(s[5:]))
    raise ValueError(f"'device' = {device!r}; expected 'cpu', 'cuda' or 'cuda:N'")


def _torch_for_cuda(what: str):
    try:
        import torch  # noqa: PLC0415 (only for CUDA allocations)
    except ImportError as e:
        raise RuntimeError(f"{what}: allocating CUDA memory needs PyTorch (import torch failed: {e}); "
                           "pass your own CUDA arrays instead") from e
    if not torch.cuda.is_available():
        raise RuntimeError(f"{what}: torch.cuda is not available on this machine")
    return torch


def _empty(shape: Sequence[int], dtype: str, device: Tuple[str, int], zero: bool = False):
    """A host (NumPy, 64-byte aligned) or CUDA (torch) array."""
    if device[0] == "cpu":
        nd = np.dtype(dtype)
        n = int(np.prod(shape)) * nd.itemsize
        raw = np.zeros(n + 64, dtype=np.uint8) if zero else np.empty(n + 64, dtype=np.uint8)
        off = (-raw.ctypes.data) % 64
        return raw[off:off + n].view(nd).reshape(shape)
    torch = _torch_for_cuda("metrale")
    tdt = {"uint8": torch.uint8, "float32": torch.float32, "int32": torch.int32}[dtype]
    f = torch.zeros if zero else torch.empty
    return f(tuple(shape), dtype=tdt, device=f"cuda:{device[1]}")


# --------------------------------------------------------------------------
# caches


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
    if isinstance(cache, PagedKVCache):
        if cache.num_layers == 1:
            return cache.layer(0)
        raise TypeError(f"'{name}': this PagedKVCache has {cache.num_layers} layers; pass cache.layer(i)")
    raise TypeError(f"'{name}': expected a metrale.KVCacheView (e.g. PagedKVCache.layer(i)), "
                    f"got {type(cache).__name__}")


class Calibrator:
    """Running absmax of K and of V over calibration batches (SYSTEM.md 1).

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
            _metrale.bf16_absmax(_dl(key), _dl(self._dev[0:1]), s)
            _metrale.bf16_absmax(_dl(value), _dl(self._dev[1:2]), s)
        else:
            _metrale.bf16_absmax(key, self._cpu[0:1], 0)
            _metrale.bf16_absmax(value, self._cpu[1:2], 0)

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

    def fp8_scales(self) -> Tuple[float, float]:
        """(k_scale, v_scale) = absmax / 448 (1.0 when nothing was observed)."""
        k, v = self.absmax
        return (fp8_scale_from_absmax(k), fp8_scale_from_absmax(v))

    def nvfp4_global_scales(self) -> Tuple[float, float]:
        """(k_global_scale, v_global_scale) = absmax / (448 * 6) (1.0 when nothing was observed)."""
        k, v = self.absmax
        return (nvfp4_global_scale_from_absmax(k), nvfp4_global_scale_from_absmax(v))


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
    """

    def __init__(self, format: Union[str, KvFormat], num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, num_layers: int = 1, device: Any = "cpu", *, cache_stride: int = 0,
                 block_stride_bytes: int = 0, data_section_bytes: int = 0, k_scale: float = 1.0,
                 v_scale: float = 1.0, k_global_scale: float = 1.0, v_global_scale: float = 1.0):
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"'num_layers' = {num_layers!r}; expected an int >= 1")
        self.layout = make_layout(format, num_blocks, block_size, num_kv_heads, head_dim, cache_stride=cache_stride,
                                  block_stride_bytes=block_stride_bytes, data_section_bytes=data_section_bytes)
        self.num_layers = num_layers
        self._device = _parse_device(device)
        shape = (num_layers, 2, self.layout.num_blocks, self.layout.page_stride_bytes)
        self._buf = _empty(shape, "uint8", self._device, zero=True)
        self._scales = [[float(k_scale), float(v_scale), float(k_global_scale), float(v_global_scale)]
                        for _ in range(num_layers)]
        self._calib = [Calibrator() for _ in range(num_layers)]

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
        if not isinstance(layer, (int, np.integer)) or not 0 <= layer < self.num_layers:
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
        return {"k_scale": s[0], "v_scale": s[1], "k_global_scale": s[2], "v_global_scale": s[3]}

    def set_scales(self, layer: Optional[int] = None, *, k_scale: Optional[float] = None,
                   v_scale: Optional[float] = None, k_global_scale: Optional[float] = None,
                   v_global_scale: Optional[float] = None) -> None:
        """Sets the given scales of `layer` (all layers when None); each must be finite and > 0."""
        layers = range(self.num_layers) if layer is None else [self._check_layer(layer)]
        for idx, (name, val) in enumerate((("k_scale", k_scale), ("v_scale", v_scale),
                                           ("k_global_scale", k_global_scale),
                                           ("v_global_scale", v_global_scale))):
            if val is None:
                continue
            if not (isinstance(val, (int, float, np.floating)) and math.isfinite(val) and val > 0):
                raise ValueError(f"'{name}' = {val!r}; expected a finite float > 0")
            for i in layers:
                self._scales[i][idx] = float(val)

    def calibrate(self, key: ArrayLike, value: ArrayLike, layer: Optional[int] = None, *,
                  stream: Any = None) -> dict:
        """Folds a calibration batch of bf16 K and V rows into the running absmax of
        `layer` (every layer when None) and sets that layer's scales from it:
        FP8 ``k_scale = absmax_k / 448``; NVFP4 ``k_global_scale = absmax_k /
        (448 * 6)`` (the same for V); BF16 has none. On CUDA this reads the
        absmax back (synchronises); calibration is not part of the decode path.
        Returns the scales of the (first) calibrated layer.
        """
        layers = range(self.num_layers) if layer is None else [self._check_layer(layer)]
        for i in layers:
            c = self._calib[i]
            c.observe(key, value, stream=stream)
            if self.format == KvFormat.fp8_e4m3:
                self._scales[i][0], self._scales[i][1] = c.fp8_scales()
            elif self.format == KvFormat.nvfp4:
                self._scales[i][2], self._scales[i][3] = c.nvfp4_global_scales()
        return self.scales(layers[0])

    def reset_calibration(self) -> None:
        for c in self._calib:
            c.reset()

    # ---- writes
    def write(self, layer: int, key: ArrayLike, value: ArrayLike, slot_mapping: ArrayLike, *,
              skipped: Optional[ArrayLike] = None, stream: Any = None) -> Optional[int]:
        """reshape_and_cache into `layer`; see :func:`reshape_and_cache`."""
        return reshape_and_cache(key, value, slot_mapping, self.layer(layer), skipped=skipped, stream=stream)

    def __repr__(self) -> str:
        return (f"PagedKVCache(format={_metrale_format_name(self.format)!r}, layers={self.num_layers}, "
                f"device={self.device!r}, {self.layout!r})")


def _metrale_format_name(f: KvFormat) -> str:
    return {KvFormat.bf16: "bf16", KvFormat.fp8_e4m3: "fp8", KvFormat.nvfp4: "nvfp4"}[f]


# --------------------------------------------------------------------------
# operations


def reshape_and_cache(key: ArrayLike, value: ArrayLike, slot_mapping: ArrayLike, cache: KVCacheView, *,
                      skipped: Optional[ArrayLike] = None, stream: Any = None) -> Optional[int]:
    """Writes each token's K and V rows into its slot of the paged caches, quantising
    to the cache's format (FP8 with k/v_scale, NVFP4 with the global scales).

    key, value: bf16 ``(num_tokens, num_kv_heads, head_dim)`` or
    ``(num_tokens, num_kv_heads * head_dim)``; rows may be strided (slices of
    a fused QKV output: row stride a multiple of 8 elements).
    slot_mapping: int64 ``(num_tokens,)``, ``block * block_size + offset``; a
    negative slot is padding (skipped); a slot past the capacity is skipped
    and counted. skipped: optional int32 array of >= 1 element on the cache's
    device, incremented per out-of-capacity slot.
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
    r = _metrale.reshape_and_cache(_dl(key), _dl(value), _dl(slot_mapping), view.layout, _dl(view.k), _dl(view.v),
                                   view.scales, None if skipped is None else _dl(skipped),
                                   _stream_handle(key, stream))
    return None if r < 0 else int(r)


def bf16_absmax(x: ArrayLike, out: Optional[ArrayLike] = None, *, stream: Any = None):
    """max |x| of bf16 values (NaNs ignored), folded into ``out``.

    x: bf16 (or uint16 bit patterns); contiguous, or rows strided along the
    first dimension only. out: float32 array of >= 1 element on x's device;
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
    if len(shape) == 2 and head_dim > 0 and shape[1] % head_dim == 0:
        return int(shape[1] // head_dim)
    raise ValueError(f"'q': expected shape (num_seqs, num_q_heads, {head_dim}), got {shape}")


def _default_out(q: Any, num_q_heads: int, head_dim: int):
    n = int(q.shape[0])
    if _is_cuda(q):
        torch = _torch_for_cuda("metrale: out=None")
        return torch.empty((n, num_q_heads, head_dim), dtype=torch.bfloat16, device=q.device)
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
    return _decode(0, q, cache, block_tables, seq_lens, out, None, 1, sliding_window, sm_scale, num_q_heads,
                   stream)


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
    _decode(1, q, cache, block_tables, seq_lens, None, workspace, num_splits, sliding_window, sm_scale,
            num_q_heads, stream)
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


def _decode(kind, q, cache, block_tables, seq_lens, out, workspace, num_splits, sliding_window, sm_scale,
            num_q_heads, stream):
    view = _as_view(cache)
    for a, n in ((q, "q"), (block_tables, "block_tables"), (seq_lens, "seq_lens")):
        _require_array(a, n)
    if workspace is not None:
        _require_writable(workspace, "workspace")
    D = int(view.layout.head_dim)
    hq = _q_heads(q, D, num_q_heads)
    if kind != 1:
        if out is None:
            out = _default_out(q, hq, D)
        else:
            _require_writable(out, "out")
    _metrale.decode(kind, _dl(q), hq, view.layout, _dl(view.k), _dl(view.v), view.scales, _dl(block_tables),
                    _dl(seq_lens), _check_window(sliding_window), _sm_scale(sm_scale, D),
                    _dl(out if kind != 1 else workspace), None if workspace is None else _dl(workspace),
                    int(num_splits), _stream_handle(q, stream))
    return out


def validate_block_tables(layout: KvCacheLayout, block_tables: ArrayLike, seq_lens: ArrayLike,
                          sliding_window: int = 0) -> None:
    """Debug check on host copies: every length in [0, max_blocks_per_seq * block_size] and
    every attended page a valid page of the cache. Raises ValueError naming the first bad sequence."""
    if isinstance(layout, (KVCacheView, PagedKVCache)):
        layout = layout.layout
    _metrale.validate_block_tables(layout, block_tables, seq_lens, _check_window(sliding_window))


# --------------------------------------------------------------------------
# planner


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
        if isinstance(layout, (KVCacheView, PagedKVCache)):
            layout = layout.layout
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


# --------------------------------------------------------------------------
# backends


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
