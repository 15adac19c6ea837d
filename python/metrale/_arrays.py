"""Array, device and stream helpers shared by the package (private), and the bf16 converters."""

from __future__ import annotations

import sys
from typing import Any, Sequence, Tuple, Union

import numpy as np

from . import _metrale
from ._metrale import KvCacheLayout, KvFormat


MAX_SPLITS: int = _metrale.max_splits()
SUPPORTED_HEAD_DIMS: tuple = _metrale.SUPPORTED_HEAD_DIMS  # head_dim of a cache layout (metrale/cache.hpp)

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


def format_name(fmt: Union[str, KvFormat]) -> str:
    """The short name of a format: 'bf16', 'fp8' or 'nvfp4'."""
    return {KvFormat.bf16: "bf16", KvFormat.fp8_e4m3: "fp8", KvFormat.nvfp4: "nvfp4"}[_format(fmt)]


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
    nvfp4_scales: str = "max6",
) -> KvCacheLayout:
    """The KvCacheLayout of one K (or V) cache of `format`, validated.

    ``cache_stride`` (fp8, elements per page) and ``block_stride_bytes`` /
    ``data_section_bytes`` (nvfp4) give padded pages; 0 means dense.
    ``nvfp4_scales``: how an NVFP4 write picks each group's scale, "max6" (the
    absmax maps to 6) or "adaptive" (the better of 6 and 4 by squared error;
    docs/nvfp4_scales.md); other formats take only "max6".
    """
    if not isinstance(nvfp4_scales, str):
        raise TypeError(f"'nvfp4_scales': expected a str ('max6' or 'adaptive'), got {type(nvfp4_scales).__name__}")
    f = _format(format)
    if f == KvFormat.bf16:
        layout = KvCacheLayout.bf16(num_blocks, block_size, num_kv_heads, head_dim)
    elif f == KvFormat.fp8_e4m3:
        layout = KvCacheLayout.fp8(num_blocks, block_size, num_kv_heads, head_dim, cache_stride)
    else:
        layout = KvCacheLayout.nvfp4(num_blocks, block_size, num_kv_heads, head_dim, block_stride_bytes,
                                     data_section_bytes)
    if nvfp4_scales != "max6":  # the layouts' default; with_nvfp4_scales raises ValueError for a bad name or format
        layout = layout.with_nvfp4_scales(nvfp4_scales)
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
    tdt = {"uint8": torch.uint8, "float32": torch.float32, "int32": torch.int32, "int64": torch.int64}[dtype]
    f = torch.zeros if zero else torch.empty
    return f(tuple(shape), dtype=tdt, device=f"cuda:{device[1]}")
