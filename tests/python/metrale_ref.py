"""Independent NumPy float64 references for the Python tests: bf16 / E4M3 /
E2M1 decoding, the FP8 quantiser, cache dequantisation from raw page bytes
(docs/spec.md 2-3) and paged decode attention. Written from the spec, not from
the library's code."""

import math

import numpy as np


def bf16_bits(x):
    """float -> uint16 bf16 bit patterns, round to nearest even (no NaN inputs here)."""
    u = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _e4m3_table():
    t = np.empty(256, dtype=np.float64)
    for c in range(256):
        s = -1.0 if c & 0x80 else 1.0
        e, m = (c >> 3) & 0xF, c & 7
        if e == 15 and m == 7:
            t[c] = math.nan
        elif e == 0:
            t[c] = s * m * 2.0 ** -9
        else:
            t[c] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def e4m3_quant(x):
    """E4M3FN code of float32 values: round to nearest, ties to even code, saturate to 448 (finite inputs)."""
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    mag = np.minimum(np.abs(x), 448.0)
    grid = E4M3[:127]  # codes 0..126: increasing non-negative values
    hi = np.clip(np.searchsorted(grid, mag), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dlo, dhi = mag - grid[lo], grid[hi] - mag
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def dequant_cache(fmt, buf, layout, scale=1.0, global_scale=1.0):
    """Raw page bytes (uint8 [num_blocks, page_stride_bytes]) -> float64 [num_blocks, block_size, H, D]."""
    nb, B, H, D = layout.num_blocks, layout.block_size, layout.num_kv_heads, layout.head_dim
    buf = np.asarray(buf, dtype=np.uint8).reshape(nb, layout.page_stride_bytes)
    if fmt == "bf16":
        return bf16_value(buf[:, : B * H * D * 2].copy().view(np.uint16).reshape(nb, B, H, D))
    if fmt == "fp8":
        return E4M3[buf[:, : B * H * D].reshape(nb, B, H, D)] * np.float64(np.float32(scale))
    data = buf[:, : B * H * D // 2].reshape(nb, B, H, D // 2)
    codes = np.empty((nb, B, H, D), dtype=np.uint8)
    codes[..., 0::2] = data & 0xF
    codes[..., 1::2] = data >> 4
    dsb = layout.data_section_bytes
    sc = E4M3[buf[:, dsb: dsb + B * H * D // 16].reshape(nb, B, H, D // 16)]
    return E2M1[codes] * np.repeat(sc, 16, axis=-1) * np.float64(np.float32(global_scale))


def gather(cache_f64, block_tables, seq_len, block_size, start=0):
    """[seq_len - start, H, D] rows of one sequence, positions [start, seq_len)."""
    pos = np.arange(start, seq_len)
    pages = block_tables[pos // block_size]
    return cache_f64[pages, pos % block_size]


def decode_ref(q_bits, kf, vf, block_tables, seq_lens, block_size, sm_scale, sliding_window=0):
    """float64 paged decode attention over dequantised caches; q bf16 bits [S, Hq, D]."""
    q = bf16_value(q_bits)
    S, Hq, D = q.shape
    Hkv = kf.shape[2]
    g = Hq // Hkv
    out = np.zeros((S, Hq, D))
    for i in range(S):
        L = int(seq_lens[i])
        if L == 0:
            continue
        start = max(0, L - sliding_window) if sliding_window > 0 else 0
        K = gather(kf, block_tables[i], L, block_size, start)
        V = gather(vf, block_tables[i], L, block_size, start)
        for h in range(Hq):
            logits = sm_scale * (K[:, h // g, :] @ q[i, h])
            p = np.exp(logits - logits.max())
            out[i, h] = (p / p.sum()) @ V[:, h // g, :]
    return out


def rel_err_blocks(out, ref):
    """max over (seq, head) of ||out - ref|| / ||ref|| (absolute where ref is 0)."""
    num = np.linalg.norm(out - ref, axis=-1)
    den = np.linalg.norm(ref, axis=-1)
    return float(np.max(np.where(den > 0, num / np.maximum(den, 1e-300), num)))
