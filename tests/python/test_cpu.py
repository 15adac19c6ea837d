"""The metrale Python package on the CPU backend, against NumPy float64
references written here (metrale_ref.py). Inputs are random, redrawn per run
(seed printed on failure), with a few large-magnitude K channels."""

import math
import zlib
import os

import numpy as np
import pytest

import metrale
import metrale_ref as ref

SEED = int(os.environ.get("METRALE_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))


@pytest.fixture
def rng(request):
    seed = (SEED + zlib.crc32(request.node.name.encode())) % (2**32)
    print(f"seed {seed} (METRALE_TEST_SEED={SEED})")
    return np.random.default_rng(seed)


def make_kv(rng, n, H, D, outlier_channels=3):
    k = rng.standard_normal((n, H, D)).astype(np.float32)
    v = rng.standard_normal((n, H, D)).astype(np.float32)
    ch = rng.choice(D, outlier_channels, replace=False)
    k[:, :, ch] *= 12.0
    return ref.bf16_bits(k), ref.bf16_bits(v)


class Batch:
    """A paged batch: random lengths, shuffled pages, K/V written through the cache."""

    def __init__(self, rng, fmt, *, num_seqs=5, Hq=8, Hkv=2, D=64, B=16, max_len=150, num_layers=1,
                 calibrate=True, lens=None, qkv_fused=False):
        self.fmt, self.B, self.D, self.Hq, self.Hkv = fmt, B, D, Hq, Hkv
        self.seq_lens = np.asarray(lens if lens is not None else rng.integers(0, max_len + 1, num_seqs),
                                   dtype=np.int32)
        self.seq_lens[0] = max_len  # at least one long sequence
        num_seqs = len(self.seq_lens)
        mb = max(1, -(-int(self.seq_lens.max()) // B))
        num_blocks = num_seqs * mb + 3
        self.cache = metrale.PagedKVCache(fmt, num_blocks, B, Hkv, D, num_layers=num_layers)
        pages = rng.permutation(num_blocks)[: num_seqs * mb].astype(np.int32)
        self.block_tables = pages.reshape(num_seqs, mb).copy()
        slots = []
        for i in range(num_seqs):
            pos = np.arange(int(self.seq_lens[i]))
            slots.append(self.block_tables[i, pos // B].astype(np.int64) * B + pos % B)
        self.slots = np.concatenate(slots) if slots else np.zeros(0, np.int64)
        n = len(self.slots)
        self.k_bits, self.v_bits = make_kv(rng, n, Hkv, D)
        if qkv_fused:  # K and V as strided column slices of one fused QKV row block
            qkv = np.zeros((n, (Hq + 2 * Hkv) * D + 8), dtype=np.uint16)
            qkv[:, Hq * D:(Hq + Hkv) * D] = self.k_bits.reshape(n, -1)
            qkv[:, (Hq + Hkv) * D:(Hq + 2 * Hkv) * D] = self.v_bits.reshape(n, -1)
            self.key = qkv[:, Hq * D:(Hq + Hkv) * D]
            self.value = qkv[:, (Hq + Hkv) * D:(Hq + 2 * Hkv) * D]
        else:
            self.key, self.value = self.k_bits, self.v_bits
        if calibrate:
            self.cache.calibrate(self.key, self.value)
        for layer in range(num_layers):
            assert self.cache.write(layer, self.key, self.value, self.slots) == 0
        self.q = ref.bf16_bits(rng.standard_normal((num_seqs, Hq, D)))

    def dequant(self, layer=0):
        s = self.cache.scales(layer)
        lay = self.cache.layout
        kf = ref.dequant_cache(self.fmt, self.cache.k(layer), lay, s["k_scale"], s["k_global_scale"])
        vf = ref.dequant_cache(self.fmt, self.cache.v(layer), lay, s["v_scale"], s["v_global_scale"])
        return kf, vf

    def reference(self, sliding_window=0, layer=0, sm_scale=None):
        kf, vf = self.dequant(layer)
        sm = 1 / math.sqrt(self.D) if sm_scale is None else sm_scale
        return ref.decode_ref(self.q, kf, vf, self.block_tables, self.seq_lens, self.B, sm, sliding_window)


def poisoned_out(n, Hq, D):
    return np.full((n, Hq, D), 0x7FC1, dtype=np.uint16)  # bf16 NaN everywhere


def check_out(out_bits, expect, tol=1e-2):
    out = ref.bf16_value(out_bits)
    assert np.all(np.isfinite(out)), "output has NaN/Inf (unwritten or bad)"
    err = ref.rel_err_blocks(out, expect)
    assert err <= tol, f"relative L2 error {err:.3g} > {tol}"


FORMATS = ["bf16", "fp8", "nvfp4"]


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("Hq,Hkv,D,B", [(8, 2, 64, 16), (4, 4, 128, 32), (16, 2, 256, 16)])
def test_decode_single_pass(rng, fmt, window, Hq, Hkv, D, B):
    b = Batch(rng, fmt, Hq=Hq, Hkv=Hkv, D=D, B=B, max_len=120 if D < 256 else 70)
    out = poisoned_out(len(b.seq_lens), Hq, D)
    r = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, out, sliding_window=window)
    assert r is out
    check_out(out, b.reference(window))
    assert np.all(ref.bf16_value(out[b.seq_lens == 0]) == 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_planner_runs_every_layer(rng, fmt):
    b = Batch(rng, fmt, num_seqs=4, max_len=300, num_layers=2, Hq=8, Hkv=2)
    plan = metrale.Planner(len(b.seq_lens), 8, b.cache.layout, int(b.seq_lens.max()), 0, "cpu")
    assert plan.num_splits >= 1 and plan.workspace_bytes >= 0
    assert (plan.workspace is None) == (plan.workspace_bytes == 0)
    for layer in range(2):
        out = poisoned_out(len(b.seq_lens), 8, 64)
        plan.run(b.q, b.cache.layer(layer), b.block_tables, b.seq_lens, out)
        check_out(out, b.reference(layer=layer))


def test_planner_splits_a_long_small_batch_and_runs_it(rng):
    metrale.set_cpu_num_threads(8)
    try:
        b = Batch(rng, "fp8", num_seqs=1, lens=[2000], max_len=2000, Hq=4, Hkv=4, D=64, B=16)
        plan = metrale.Planner(1, 4, b.cache, 2000, device="cpu")
        assert plan.num_splits > 1, plan
        assert plan.plan.workspace_bytes == metrale.splitk_workspace_bytes(1, 4, 64, plan.num_splits)
        assert plan.workspace_bytes >= plan.plan.workspace_bytes
        out = plan.run(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sm_scale=0.1)
        check_out(out, b.reference(sm_scale=0.1))
    finally:
        metrale.set_cpu_num_threads(os.cpu_count() or 1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
@pytest.mark.parametrize("window", [0, 45])
def test_splitk_equals_single_pass(rng, fmt, num_splits, window):
    b = Batch(rng, fmt, num_seqs=4, max_len=200)
    n = len(b.seq_lens)
    single = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=window)
    ws = np.full(metrale.splitk_workspace_bytes(n, 8, 64, num_splits) // 4, np.nan, dtype=np.float32)
    r = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=window,
                          num_splits=num_splits, merge="states_only", workspace=ws)
    assert r is ws
    out = poisoned_out(n, 8, 64)
    metrale.reduce_states(ws, out, num_splits)
    expect = b.reference(window)
    check_out(out, expect)
    # Both are f32 accumulations rounded to bf16: equal to within a bf16 rounding or two.
    a, s = ref.bf16_value(out), ref.bf16_value(single)
    assert np.allclose(a, s, rtol=2 ** -7, atol=2e-3 * np.abs(s).max())


def test_reduce_merges_states_from_anywhere(rng):
    """Partial states written by NumPy (docs/spec.md 4), including an empty split."""
    S, Hq, D, P = 3, 4, 64, 3
    o = rng.standard_normal((S, Hq, P, D)).astype(np.float32)
    m = rng.standard_normal((S, Hq, P)).astype(np.float32) * 4
    l = rng.uniform(0.5, 20, (S, Hq, P)).astype(np.float32)
    m[:, :, 1] = -np.inf
    l[:, :, 1] = 0
    ws = np.concatenate([o, m[..., None], l[..., None]], axis=-1).reshape(-1)
    out = poisoned_out(S, Hq, D)
    metrale.reduce_states(ws, out, P)
    M = m.max(axis=-1, keepdims=True).astype(np.float64)
    w = l * np.exp(m - M)
    expect = (w[..., None] * o).sum(axis=2) / w.sum(axis=-1)[..., None]
    check_out(out, expect)


def test_strided_q_and_fused_qkv_rows(rng):
    b = Batch(rng, "nvfp4", num_seqs=3, max_len=64, qkv_fused=True)
    qkv = np.zeros((3, 8 * 64 + 4 * 64 + 8), dtype=np.uint16)
    qkv[:, : 8 * 64] = b.q.reshape(3, -1)
    q_view = qkv[:, : 8 * 64].reshape(3, 8, 64)  # rows strided, heads contiguous
    out = metrale.attention(q_view, b.cache.layer(0), b.block_tables, b.seq_lens)
    check_out(out, b.reference())


def test_accepts_torch_cpu_tensors(rng):
    torch = pytest.importorskip("torch")
    b = Batch(rng, "bf16", num_seqs=3, max_len=50)
    q = torch.from_numpy(b.q.view(np.int16)).view(torch.bfloat16)
    out = torch.empty((3, 8, 64), dtype=torch.bfloat16)
    metrale.attention(q, b.cache.layer(0), torch.from_numpy(b.block_tables), torch.from_numpy(b.seq_lens), out)
    check_out(out.view(torch.int16).numpy().view(np.uint16), b.reference())


# ---------------------------------------------------------------- cache writes


def test_bf16_write_round_trip_exact(rng):
    b = Batch(rng, "bf16", num_seqs=3, max_len=70, qkv_fused=True)
    kf, vf = b.dequant()
    for j, slot in enumerate(b.slots):
        p, t = divmod(int(slot), b.B)
        assert np.array_equal(kf[p, t], ref.bf16_value(b.k_bits[j]))
        assert np.array_equal(vf[p, t], ref.bf16_value(b.v_bits[j]))


def test_fp8_write_codes_bit_exact(rng):
    b = Batch(rng, "fp8", num_seqs=3, max_len=70)
    s = b.cache.scales(0)
    lay = b.cache.layout
    kc = b.cache.k(0)[:, : lay.block_size * 2 * 64].reshape(-1, lay.block_size, 2, 64)
    vc = b.cache.v(0)[:, : lay.block_size * 2 * 64].reshape(-1, lay.block_size, 2, 64)
    inv_k = np.float32(1.0) / np.float32(s["k_scale"])
    inv_v = np.float32(1.0) / np.float32(s["v_scale"])
    p, t = np.divmod(b.slots, b.B)
    kx = (ref.bf16_value(b.k_bits).astype(np.float32) * inv_k).astype(np.float32)
    vx = (ref.bf16_value(b.v_bits).astype(np.float32) * inv_v).astype(np.float32)
    assert np.array_equal(kc[p, t], ref.e4m3_quant(kx))
    assert np.array_equal(vc[p, t], ref.e4m3_quant(vx))


def test_nvfp4_write_round_trip_within_format_error(rng):
    b = Batch(rng, "nvfp4", num_seqs=3, max_len=70)
    kf, _ = b.dequant()
    p, t = np.divmod(b.slots, b.B)
    x = ref.bf16_value(b.k_bits)
    got = kf[p, t]
    g = b.cache.scales(0)["k_global_scale"]
    xs = x.reshape(len(x), 2, 4, 16)
    gs = got.reshape(xs.shape)
    amax = np.abs(xs).max(axis=-1, keepdims=True)
    # half the widest E2M1 gap (4 -> 6) of a scale ~ amax / 6, plus the E4M3 rounding of the scale
    bound = amax / 6 * (1.0 + 2 ** -3) * 1.0 + 0.07 * amax + 1e-6 * g
    assert np.all(np.abs(gs - xs) <= bound)
    rel = np.linalg.norm(gs - xs) / np.linalg.norm(xs)
    assert rel < 0.15, rel


def test_padding_and_out_of_capacity_slots(rng):
    cache = metrale.PagedKVCache("fp8", 2, 16, 1, 64)
    k, v = make_kv(rng, 4, 1, 64)
    slots = np.array([0, -1, 32, 1000], dtype=np.int64)  # capacity 32
    counter = np.zeros(1, dtype=np.int32)
    assert cache.write(0, k, v, slots, skipped=counter) == 2
    assert counter[0] == 2
    kc = cache.k(0)
    assert np.any(kc[0, :64] != 0)
    assert np.all(kc[0, 64:] == 0) and np.all(kc[1] == 0)


# ---------------------------------------------------------------- calibration


def test_bf16_absmax_and_fp8_calibration(rng):
    k1, v1 = make_kv(rng, 40, 2, 64)
    k2, v2 = make_kv(rng, 40, 2, 64)
    k2[3, 1, 5] = ref.bf16_bits([-300.0])[0]
    assert metrale.bf16_absmax(k1) == np.abs(ref.bf16_value(k1)).max()
    acc = np.zeros(1, dtype=np.float32)
    metrale.bf16_absmax(k1, acc)
    metrale.bf16_absmax(k2[:, 1, :], acc)  # strided rows
    assert acc[0] == max(np.abs(ref.bf16_value(k1)).max(), np.abs(ref.bf16_value(k2[:, 1])).max())

    cache = metrale.PagedKVCache("fp8", 4, 16, 2, 64, num_layers=2)
    cache.calibrate(k1, v1, layer=0)
    cache.calibrate(k2, v2, layer=0)
    ak = max(np.abs(ref.bf16_value(k1)).max(), np.abs(ref.bf16_value(k2)).max())
    av = max(np.abs(ref.bf16_value(v1)).max(), np.abs(ref.bf16_value(v2)).max())
    s = cache.scales(0)
    assert s["k_scale"] == np.float32(ak) / np.float32(448) == np.float32(300) / np.float32(448)
    assert s["v_scale"] == np.float32(av) / np.float32(448)
    assert cache.scales(1)["k_scale"] == 1.0  # layer 1 untouched
    assert cache.layer(0).k_scale == s["k_scale"]  # views follow the cache's scales


def test_nvfp4_calibration_and_helpers(rng):
    k, v = make_kv(rng, 30, 2, 64)
    cache = metrale.PagedKVCache("nvfp4", 4, 16, 2, 64)
    s = cache.calibrate(k, v)
    ak = np.float32(np.abs(ref.bf16_value(k)).max())
    assert s["k_global_scale"] == ak / np.float32(448 * 6)
    assert s["k_global_scale"] == metrale.nvfp4_global_scale_from_absmax(float(ak))
    assert s["k_scale"] == 1.0
    assert metrale.fp8_scale_from_absmax(0.0) == 1.0
    assert metrale.nvfp4_global_scale_from_absmax(0.0) == 1.0
    assert metrale.fp8_scale_from_absmax(448.0) == 1.0


def test_cache_sizes():
    for fmt, bpt in (("bf16", 4096), ("fp8", 2048), ("nvfp4", 1152)):
        c = metrale.PagedKVCache(fmt, 10, 16, 8, 128, num_layers=3)
        assert c.bytes_per_token_per_layer == bpt
        assert c.bytes_per_token == 3 * bpt
        assert c.capacity == 160
        assert c.k(2).shape == (10, c.layout.page_stride_bytes)
        assert c.nbytes == 2 * 3 * c.layout.cache_bytes
        assert len(list(c)) == 3
    c = metrale.PagedKVCache("fp8", 10, 16, 8, 128, cache_stride=16 * 8 * 128 + 64)
    assert c.layout.page_stride_bytes == 16 * 8 * 128 + 64


# ---------------------------------------------------------------- bad input


@pytest.fixture
def small(rng):
    return Batch(rng, "fp8", num_seqs=3, max_len=40)


def test_bad_q_dtype(small):
    with pytest.raises(TypeError, match=r"'q'.*bfloat16.*float32"):
        metrale.attention(small.q.astype(np.float32), small.cache.layer(0), small.block_tables, small.seq_lens)


def test_bad_q_shape(small):
    with pytest.raises(ValueError, match=r"'q'.*expected.*shape"):
        metrale.attention(small.q[:, :, :32], small.cache.layer(0), small.block_tables, small.seq_lens)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(sliding_window=True), ValueError, "'sliding_window' = True"),
    (dict(sliding_window=2.5), ValueError, "'sliding_window' = 2.5"),
    (dict(max_q_len=3.5), ValueError, "'max_q_len' = 3.5"),
    (dict(max_seq_len=-1), ValueError, "'max_seq_len' = -1"),
    (dict(num_q_heads=float("inf")), ValueError, "'num_q_heads' = inf"),
    (dict(sm_scale="0.1"), TypeError, "'sm_scale'.*str"),
    (dict(softcap=True), TypeError, "'softcap'.*bool"),
    (dict(softcap=-1.0), ValueError, "'softcap' = -1.0"),
])
def test_bad_scalars_are_refused_not_rounded(small, kw, exc, match):
    """Counts take ints (not bools, floats or strings), scales finite reals: nothing is truncated
    or read as 1 on the way to the plan."""
    with pytest.raises(exc, match=match):
        metrale.attention(small.q, small.cache.layer(0), small.block_tables, small.seq_lens, **kw)


def test_bad_gqa_ratio(small):
    q = np.zeros((3, 3, 64), dtype=np.uint16)
    with pytest.raises(ValueError, match=r"num_q_heads.*3.*num_kv_heads = 2"):
        metrale.attention(q, small.cache.layer(0), small.block_tables, small.seq_lens)
    with pytest.raises(ValueError, match=r"num_q_heads.*num_kv_heads = 2"):
        metrale.Planner(3, 5, small.cache.layout, 40)


def test_bad_table_dtypes_and_shapes(small):
    view = small.cache.layer(0)
    with pytest.raises(TypeError, match=r"'block_tables'.*int32.*int16"):  # int64 host tables are converted
        metrale.attention(small.q, view, small.block_tables.astype(np.int16), small.seq_lens)
    with pytest.raises(TypeError, match=r"'seq_lens'.*int32"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens.astype(np.float32))
    with pytest.raises(ValueError, match=r"'seq_lens'.*shape \(3,\)"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens[:2])
    with pytest.raises(ValueError, match=r"'block_tables'.*num_seqs = 3"):
        metrale.attention(small.q, view, small.block_tables[:2], small.seq_lens)


def test_bad_out(small):
    view = small.cache.layer(0)
    with pytest.raises(ValueError, match=r"'out'.*shape"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, np.zeros((3, 8, 32), np.uint16))
    strided = np.zeros((3, 8, 128), np.uint16)[:, :, ::2]
    with pytest.raises(ValueError, match=r"'out'"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, strided)
    with pytest.raises(TypeError, match=r"'out'.*bfloat16"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, np.zeros((3, 8, 64), np.float32))


def test_bad_workspace(small):
    view = small.cache.layer(0)
    need = metrale.splitk_workspace_bytes(3, 8, 64, 4)
    ws = np.zeros(need // 4 - 1, np.float32)
    states = dict(num_splits=4, merge="states_only")
    with pytest.raises(ValueError, match=rf"workspace_bytes.*>= {need}"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, workspace=ws, **states)
    with pytest.raises(TypeError, match=r"'workspace'.*float32"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, workspace=np.zeros(need, np.uint8),
                          **states)
    with pytest.raises(ValueError, match=r"num_splits"):
        metrale.attention(small.q, view, small.block_tables, small.seq_lens, workspace=ws, num_splits=-1)
    with pytest.raises(ValueError, match=r"workspace_bytes"):
        metrale.reduce_states(ws, np.zeros((3, 8, 64), np.uint16), 4)


def test_bad_alignment_and_strides(small):
    view = small.cache.layer(0)
    flat = np.zeros(3 * 8 * 64 + 1, np.uint16)
    misaligned = flat[1:].reshape(3, 8, 64)
    with pytest.raises(ValueError, match=r"'q'.*16-byte aligned"):
        metrale.attention(misaligned, view, small.block_tables, small.seq_lens)
    rows = np.zeros((3, 8 * 64 + 4), np.uint16)[:, : 8 * 64]  # row stride 516: not a multiple of 8
    with pytest.raises(ValueError, match=r"'q_stride' = 516.*multiple of 8"):
        metrale.attention(rows, view, small.block_tables, small.seq_lens, num_q_heads=8)
    k, v = make_kv(np.random.default_rng(1), 2, 2, 64)
    with pytest.raises(ValueError, match=r"'key'.*contiguous"):
        small.cache.write(0, np.ascontiguousarray(k.transpose(0, 2, 1)).transpose(0, 2, 1), v,
                          np.zeros(2, np.int64))


def test_bad_cache_arguments(small):
    k, v = make_kv(np.random.default_rng(2), 2, 2, 64)
    with pytest.raises(TypeError, match=r"'slot_mapping'.*int64.*int32"):
        small.cache.write(0, k, v, np.zeros(2, np.int32))
    with pytest.raises(ValueError, match=r"'slot_mapping'.*shape \(2,\)"):
        small.cache.write(0, k, v, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"'key'.*\(rows, 2, 64\)"):
        small.cache.write(0, k[:, :1], v, np.zeros(2, np.int64))
    lay = small.cache.layout
    short = metrale.KVCacheView(lay, np.zeros(lay.cache_bytes - 16, np.uint8), small.cache.v(0))
    with pytest.raises(ValueError, match=r"'k_cache'.*at least layout.cache_bytes"):
        metrale.reshape_and_cache(k, v, np.zeros(2, np.int64), short)
    with pytest.raises(ValueError, match=r"k_scale"):
        small.cache.set_scales(k_scale=0.0)
    with pytest.raises(ValueError, match=r"'k_scale' = True"):  # a bool is not a scale
        small.cache.set_scales(k_scale=True)
    with pytest.raises(ValueError, match=r"'layer' = True"):  # nor a layer index
        small.cache.write(True, k, v, np.zeros(2, np.int64))
    with pytest.raises(TypeError, match=r"'key'.*array.*list"):
        small.cache.write(0, [[1]], v, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"'layer' = 5"):
        small.cache.layer(5)


def test_bad_layouts():
    with pytest.raises(ValueError, match=r"head_dim.*96.*64, 128, 256"):
        metrale.PagedKVCache("bf16", 4, 16, 2, 96)
    with pytest.raises(ValueError, match=r"block_size.*24"):
        metrale.PagedKVCache("nvfp4", 4, 24, 2, 64)
    with pytest.raises(ValueError, match=r"'format'.*'int4'"):
        metrale.PagedKVCache("int4", 4, 16, 2, 64)
    with pytest.raises(ValueError, match=r"'device'"):
        metrale.PagedKVCache("fp8", 4, 16, 2, 64, device="tpu")


def test_planner_checks(small):
    plan = metrale.Planner(3, 8, small.cache.layout, 40)
    other = metrale.PagedKVCache("bf16", 8, 16, 2, 64)
    with pytest.raises(ValueError, match=r"'cache'.*does not match the planner"):
        plan.run(small.q, other.layer(0), small.block_tables, small.seq_lens)
    big_q = np.zeros((4, 8, 64), np.uint16)
    with pytest.raises(ValueError, match=r"'q': 4 rows.*expected at most num_seqs = 3"):
        plan.run(big_q, small.cache.layer(0), np.zeros((4, 3), np.int32), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"sliding_window"):
        metrale.Planner(3, 8, small.cache.layout, 40, sliding_window=-1)


def test_validate_block_tables(small):
    metrale.validate_block_tables(small.cache.layout, small.block_tables, small.seq_lens)
    bad = small.block_tables.copy()
    bad[1, 0] = 10_000
    lens = small.seq_lens.copy()
    lens[1] = 5
    with pytest.raises(ValueError, match=r"metrale"):
        metrale.validate_block_tables(small.cache, bad, lens)


def test_cuda_array_requires_gpu_gracefully():
    assert isinstance(metrale.cuda_available(), bool)
    if not metrale.cuda_available():
        with pytest.raises((metrale.CudaError, RuntimeError)):
            metrale.Planner(1, 8, metrale.make_layout("bf16", 4, 16, 2, 64), 10, device="cuda")


def test_bf16_helpers_round_trip():
    x = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0], dtype=np.float32)
    b = metrale.to_bf16(x)
    assert b.dtype == np.uint16
    assert np.array_equal(b, ref.bf16_bits(x))
    assert np.array_equal(metrale.from_bf16(b), ref.bf16_value(b).astype(np.float32))


def test_user_buffers_and_calibrator(rng):
    """A KVCacheView over caller-owned buffers (typed any way), calibrated by hand."""
    lay = metrale.make_layout("fp8", 6, 16, 2, 64)
    kbuf = np.zeros((6, 16, 2, 64), dtype=np.uint8)
    vbuf = np.zeros(lay.cache_bytes, dtype=np.uint8)
    k, v = make_kv(rng, 50, 2, 64)
    cal = metrale.Calibrator()
    cal.observe(k[:25], v[:25])
    cal.observe(k[25:], v[25:])
    scales = cal.scales("fp8")
    ks, vs = scales["k_scale"], scales["v_scale"]
    assert ks == np.float32(np.abs(ref.bf16_value(k)).max()) / np.float32(448)
    assert cal.scales("nvfp4")["k_global_scale"] == np.float32(np.abs(ref.bf16_value(k)).max()) / np.float32(448 * 6)
    assert cal.scales("bf16") == {}
    view = metrale.KVCacheView(lay, kbuf, vbuf, **scales)
    block_tables = np.array([[5, 0, 3, 1]], dtype=np.int32)
    pos = np.arange(50)
    slots = block_tables[0, pos // 16].astype(np.int64) * 16 + pos % 16
    assert metrale.reshape_and_cache(k, v, slots, view) == 0
    q = ref.bf16_bits(rng.standard_normal((1, 4, 64)))
    seq_lens = np.array([50], dtype=np.int32)
    out = metrale.attention(q, view, block_tables, seq_lens, sliding_window=20)
    kf = ref.dequant_cache("fp8", kbuf.reshape(6, -1), lay, ks)
    vf = ref.dequant_cache("fp8", vbuf.reshape(6, -1), lay, vs)
    check_out(out, ref.decode_ref(q, kf, vf, block_tables, seq_lens, 16, 1 / 8, 20))


def test_empty_batch():
    cache = metrale.PagedKVCache("bf16", 2, 16, 2, 64)
    out = metrale.attention(np.zeros((0, 4, 64), np.uint16), cache.layer(0), np.zeros((0, 1), np.int32),
                         np.zeros(0, np.int32))
    assert out.shape == (0, 4, 64)
    assert cache.write(0, np.zeros((0, 2, 64), np.uint16), np.zeros((0, 2, 64), np.uint16),
                       np.zeros(0, np.int64)) == 0


def test_decode_path_never_imports_torch():
    import subprocess
    import sys
    code = (
        "import sys, numpy as np, metrale\n"
        "c = metrale.PagedKVCache('fp8', 4, 16, 2, 64)\n"
        "k = np.zeros((3, 2, 64), np.uint16)\n"
        "c.calibrate(k, k); c.write(0, k, k, np.arange(3, dtype=np.int64))\n"
        "p = metrale.Planner(1, 4, c.layout, 3)\n"
        "p.run(np.zeros((1, 4, 64), np.uint16), c.layer(0), np.zeros((1, 1), np.int32), np.full(1, 3, np.int32))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_read_only_inputs_are_accepted(rng):
    b = Batch(rng, "bf16", num_seqs=2, max_len=40)
    for a in (b.q, b.block_tables, b.seq_lens):
        a.setflags(write=False)
    out = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens)
    check_out(out, b.reference())
    ro_out = np.zeros((2, 8, 64), np.uint16)
    ro_out.setflags(write=False)
    with pytest.raises(ValueError, match=r"'out': read-only"):
        metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, ro_out)


def test_planner_binds_the_plan_and_its_options(rng):
    b = Batch(rng, "bf16", num_seqs=3, lens=[700, 0, 1300], max_len=1300, Hq=8, Hkv=2, D=64, B=16)
    plan = metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", num_splits=3)
    assert isinstance(plan.plan, metrale.AttnPlan)
    assert (plan.plan.kernel, plan.num_splits, plan.plan.merge) == ("decode", 3, "workspace")
    assert plan.plan.grid[1] == 3 and plan.plan.num_q_rows == 3
    assert plan.plan.workspace_bytes == metrale.splitk_workspace_bytes(3, 8, 64, 3)
    assert "AttnPlan(kernel=decode, num_splits=3, merge=workspace" in repr(plan)
    out = poisoned_out(3, 8, 64)
    plan.run(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, out)
    check_out(out, b.reference())
    single = metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", merge="single_pass")
    assert (single.num_splits, single.plan.merge, single.workspace) == (1, "single_pass", None)
    runs = metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", query_runs=True)
    assert runs.plan.kernel == "query_runs" and runs.plan.num_q_rows == 3
    states = metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", num_splits=2, merge="states_only")
    ws = states.run(b.q, b.cache.layer(0), b.block_tables, b.seq_lens)
    assert ws is states.workspace and states.plan.merge == "states_only"
    out = poisoned_out(3, 8, 64)
    metrale.reduce_states(ws, out, 2)
    check_out(out, b.reference())
    with pytest.raises(ValueError, match="cluster"):  # the CPU target has no clusters
        metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", num_splits=2, merge="cluster")
    with pytest.raises(ValueError, match="merge"):
        metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", merge="sideways")
    with pytest.raises(ValueError, match="num_splits"):
        metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", num_splits=-1)
    with pytest.raises(ValueError, match="num_splits"):
        metrale.Planner(3, 8, b.cache.layout, 1300, device="cpu", num_splits=metrale.MAX_SPLITS + 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_query_rows_are_decodes_of_their_prefixes(rng, fmt):
    b = Batch(rng, fmt, num_seqs=3, lens=[40, 0, 90], max_len=90, Hq=8, Hkv=2, D=64, B=16)
    runs = np.array([3, 0, 5], dtype=np.int32)
    q_start = np.concatenate([[0], np.cumsum(runs)]).astype(np.int32)
    rows = int(q_start[-1])
    q = ref.bf16_bits(rng.standard_normal((rows, 8, 64)))
    lse = np.full((rows, 8), np.nan, dtype=np.float32)
    out = metrale.attention(q, b.cache.layer(0), b.block_tables, b.seq_lens, q_start=q_start, lse=lse,
                            sliding_window=20)
    assert out.shape == (rows, 8, 64) and np.isfinite(lse).all()
    for s in range(3):
        for j in range(int(runs[s])):
            row = int(q_start[s]) + j
            pos_len = np.array([int(b.seq_lens[s]) - int(runs[s]) + j + 1], dtype=np.int32)
            one = metrale.attention(q[row:row + 1], b.cache.layer(0), b.block_tables[s:s + 1], pos_len,
                                    sliding_window=20)
            assert np.array_equal(one[0], out[row]), (s, j)
    # The planner's plan for runs of up to 5 rows, split-K: the same within rounding; -inf sinks are none;
    # lse asked for is returned.
    plan = metrale.Planner(3, 8, b.cache.layout, 90, sliding_window=20, device="cpu", num_splits=3, max_q_len=5,
                           num_q_rows=rows, attn_options=True)
    assert plan.plan.max_q_len == 5 and plan.plan.kernel == "query_runs"
    sinks = np.full(8, -np.inf, dtype=np.float32)
    split, split_lse = plan.run(q, b.cache.layer(0), b.block_tables, b.seq_lens, q_start=q_start, sinks=sinks,
                                return_lse=True)
    np.testing.assert_allclose(metrale.from_bf16(split), metrale.from_bf16(out), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(split_lse, lse, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="q_start"):
        metrale.attention(q, b.cache.layer(0), b.block_tables, b.seq_lens,
                          q_start=np.array([0, 5, 3, 8], dtype=np.int32))
    # Runs of at most one row go through the runs kernel too (q_start given); a decode Planner says so.
    ones = np.array([0, 1, 1, 2], dtype=np.int32)
    single = metrale.attention(q[:2], b.cache.layer(0), b.block_tables, b.seq_lens, q_start=ones,
                               sliding_window=20)
    dec = metrale.attention(q[[0, 0, 1]], b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=20)
    assert np.array_equal(single[0], dec[0]) and np.array_equal(single[1], dec[2])
    dec_plan = metrale.Planner(3, 8, b.cache.layout, 90, sliding_window=20, device="cpu")
    assert dec_plan.plan.kernel == "decode" and dec_plan.runs_plan.kernel == "query_runs"
    assert np.array_equal(dec_plan.run(q[:2], b.cache.layer(0), b.block_tables, b.seq_lens, q_start=ones), single)
    only = metrale.Planner(3, 8, b.cache.layout, 90, device="cpu", runs_plan=False)
    with pytest.raises(ValueError, match="runs_plan"):
        only.run(q[:2], b.cache.layer(0), b.block_tables, b.seq_lens, q_start=ones)
    with pytest.raises(ValueError, match="softcap"):
        metrale.attention(q, b.cache.layer(0), b.block_tables, b.seq_lens, q_start=q_start, softcap=-1.0)


def test_client_api_fixes(rng):
    """transformers' 4-D shapes, the layer's window per run,
    scales fixed once tokens are written, calibration errors naming the argument,
    the planner's device taken from the cache."""
    b = Batch(rng, "fp8", num_seqs=3, lens=[50, 20, 70], max_len=70, Hq=8, Hkv=2, D=64, B=16)
    ref_out = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens)
    q4 = b.q.reshape(3, 8, 1, 64)                    # (batch, heads, 1, D)
    out4 = np.empty((3, 1, 8, 64), dtype=np.uint16)  # (batch, 1, heads, D)
    metrale.attention(q4, b.cache.layer(0), b.block_tables, b.seq_lens, out4)
    assert np.array_equal(out4.reshape(3, 8, 64), ref_out)
    # One plan, the layer's own window per run.
    plan = metrale.Planner(3, 8, b.cache, 70)
    assert plan.device == "cpu"  # the cache's device
    win = plan.run(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=16)
    want = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=16)
    np.testing.assert_allclose(metrale.from_bf16(win), metrale.from_bf16(want), rtol=2e-2, atol=2e-2)
    # Scales are fixed once a layer holds tokens.
    with pytest.raises(ValueError, match=r"'layer' = 0.*re-calibrating"):
        b.cache.calibrate(b.key, b.value)
    with pytest.raises(ValueError, match=r"setting scales"):
        b.cache.set_scales(0, k_scale=2.0)
    b.cache.set_scales(0, k_scale=2.0, force=True)
    assert b.cache.scales(0)["k_scale"] == 2.0
    # Calibration names its own arguments.
    fresh = metrale.PagedKVCache("fp8", 4, 16, 2, 64)
    strided = np.zeros((4, 2, 128), dtype=np.uint16)[:, :, ::2]
    with pytest.raises(ValueError, match=r"'key'"):
        fresh.calibrate(strided, strided)


def test_out_has_the_callers_array_type(rng):
    """A torch CPU q gets a torch bf16 out."""
    torch = pytest.importorskip("torch")
    b = Batch(rng, "bf16", num_seqs=2, lens=[30, 10], max_len=30, Hq=8, Hkv=2, D=64, B=16)
    q = torch.from_numpy(b.q.view(np.int16)).view(torch.bfloat16)
    out = metrale.attention(q, b.cache.layer(0), b.block_tables, b.seq_lens)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and out.device.type == "cpu"
    want = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens)
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), want)


def test_int64_host_tables_are_accepted(rng):
    """NumPy's (and torch's) default int64 block tables and lengths work on the host."""
    b = Batch(rng, "nvfp4", num_seqs=3, lens=[50, 20, 70], max_len=70, Hq=8, Hkv=2, D=64, B=16)
    want = metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens)
    got = metrale.attention(b.q, b.cache.layer(0), b.block_tables.astype(np.int64), b.seq_lens.astype(np.int64))
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="block_tables"):
        metrale.attention(b.q, b.cache.layer(0), np.full_like(b.block_tables, 2**40, dtype=np.int64), b.seq_lens)


# ------------------------------------------------ q as a head-major view


@pytest.mark.parametrize("fmt", FORMATS)
def test_head_major_q_equals_packed_q(rng, fmt):
    """transformers' batch-1 query (1, heads, tokens, D) read as (tokens, heads, D): heads
    strided (tokens * D apart), rows D apart. Decode and query runs give the packed q's rows."""
    b = Batch(rng, fmt, num_seqs=3, lens=[40, 9, 70], max_len=70, Hq=8, Hkv=2, D=64, B=16)
    view = b.cache.layer(0)
    for q_start in (None, np.array([0, 4, 5, 11], dtype=np.int32)):
        rows = 3 if q_start is None else 11
        packed = ref.bf16_bits(rng.standard_normal((rows, 8, 64)))
        hm = np.ascontiguousarray(packed.transpose(1, 0, 2)).transpose(1, 0, 2)  # (rows, heads, D) view
        assert hm.strides == (64 * 2, rows * 64 * 2, 2)
        want = metrale.attention(packed, view, b.block_tables, b.seq_lens, q_start=q_start, sliding_window=30)
        got = metrale.attention(hm, view, b.block_tables, b.seq_lens, q_start=q_start, sliding_window=30)
        assert np.array_equal(got, want)
        four = hm.transpose(1, 0, 2)[None]  # the (1, heads, tokens, D) tensor itself
        assert np.array_equal(metrale.attention(four, view, b.block_tables, b.seq_lens, q_start=q_start,
                                                sliding_window=30), want)
    overlap = np.lib.stride_tricks.as_strided(packed, (11, 8, 64), (64 * 2, 64 * 2, 2))  # heads on rows
    with pytest.raises(ValueError, match="q_stride|q_head_stride"):
        metrale.attention(overlap, view, b.block_tables, b.seq_lens, q_start=np.array([0, 4, 5, 11], np.int32))


# ------------------------------------------ what a Planner runs and refuses


def test_planner_rows_default_to_num_seqs_times_max_q_len(rng):
    """Planner(num_seqs, ..., max_q_len=N) without num_q_rows plans num_seqs * N rows, and a
    multi-token batch of that many rows runs on it."""
    b = Batch(rng, "fp8", num_seqs=3, lens=[40, 20, 70], max_len=70, Hq=8, Hkv=2, D=64, B=16)
    plan = metrale.Planner(3, 8, b.cache.layout, 70, device="cpu", max_q_len=8)
    assert plan.plan.num_q_rows == 24 and plan.plan.kernel == "query_runs"
    q_start = np.array([0, 8, 16, 24], dtype=np.int32)
    q = ref.bf16_bits(rng.standard_normal((24, 8, 64)))
    got = plan.run(q, b.cache.layer(0), b.block_tables, b.seq_lens, q_start=q_start)
    want = metrale.attention(q, b.cache.layer(0), b.block_tables, b.seq_lens, q_start=q_start)
    np.testing.assert_allclose(metrale.from_bf16(got), metrale.from_bf16(want), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="num_q_rows = 24"):
        plan.run(ref.bf16_bits(rng.standard_normal((25, 8, 64))), b.cache.layer(0), b.block_tables, b.seq_lens,
                 q_start=np.array([0, 8, 16, 25], dtype=np.int32))


def test_planner_runs_any_batch_that_fits(rng):
    """Runs of 0 or 1 rows (an engine's mixed step) and an empty batch run on a max_q_len=8
    plan; a decode plan runs fewer sequences than it was made for."""
    b = Batch(rng, "bf16", num_seqs=4, lens=[40, 20, 70, 5], max_len=70, Hq=8, Hkv=2, D=64, B=16)
    view = b.cache.layer(0)
    plan = metrale.Planner(4, 8, b.cache.layout, 70, device="cpu", max_q_len=8, attn_options=True)
    q = ref.bf16_bits(rng.standard_normal((3, 8, 64)))
    q_start = np.array([0, 1, 1, 2, 3], dtype=np.int32)  # runs 1, 0, 1, 1
    got, lse = plan.run(q, view, b.block_tables, b.seq_lens, q_start=q_start, return_lse=True)
    want = metrale.attention(q[[0, 0, 1, 2]], view, b.block_tables, b.seq_lens)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1:], want[2:]) and np.isfinite(lse).all()
    empty = plan.run(np.zeros((0, 8, 64), np.uint16), view, b.block_tables[:0], b.seq_lens[:0],
                     q_start=np.zeros(1, np.int32))
    assert empty.shape == (0, 8, 64)
    dec = metrale.Planner(4, 8, b.cache.layout, 70, device="cpu")
    assert np.array_equal(dec.run(b.q[:2], view, b.block_tables[:2], b.seq_lens[:2]),
                          metrale.attention(b.q[:2], view, b.block_tables[:2], b.seq_lens[:2]))
    # a decode Planner (max_q_len=1) serves the same runs of at most one row, and lse, through its runs plan
    got1, lse1 = dec.run(q, view, b.block_tables, b.seq_lens, q_start=q_start, return_lse=True)
    assert np.array_equal(got1, got) and np.array_equal(lse1, lse)


def test_forced_splits_past_the_workspace_bound_raise_before_allocating():
    """Forcing num_splits on prefill-sized runs (130 sequences of up to 4000 rows, 64 splits:
    hundreds of GiB of split-K states) raises ValueError naming the bytes; the planner's own
    choice stays within the bound."""
    layout = metrale.make_layout("fp8", 4096, 16, 8, 128)
    with pytest.raises(ValueError, match=r"max_workspace_bytes|bytes"):
        metrale.Planner(130, 32, layout, 4000, device="cpu", max_q_len=4000, num_splits=64)
    with pytest.raises(ValueError, match=r"bytes"):
        metrale.Planner(4, 8, metrale.make_layout("bf16", 64, 16, 2, 64), 1000, device="cpu", num_splits=4,
                        max_workspace_bytes=1024)
    own = metrale.Planner(130, 32, layout, 4000, device="cpu", max_q_len=4000, allocate_workspace=False)
    assert own.workspace_bytes <= metrale.planner.DEFAULT_MAX_WORKSPACE_BYTES
    small = metrale.Planner(2, 8, metrale.make_layout("bf16", 64, 16, 2, 64), 1000, device="cpu",
                            max_workspace_bytes=1 << 20)
    assert small.workspace_bytes <= 1 << 20


# ------------------------------------- head-strided cache writes


def _head_major(rng, B, H, S, D):
    """transformers' (B, Hkv, S, D) K and V cache tensors (bf16 bits)."""
    k, v = make_kv(rng, B * S, H, D)
    return (k.reshape(B, S, H, D).transpose(0, 2, 1, 3).copy(), v.reshape(B, S, H, D).transpose(0, 2, 1, 3).copy())


def _write_both(fmt, H, D, key, value, key_packed, value_packed, slots):
    """Writes the strided and the packed inputs into two caches; returns both caches."""
    caches = []
    for k, v in ((key, value), (key_packed, value_packed)):
        c = metrale.PagedKVCache(fmt, 6, 16, H, D, k_scale=0.02, v_scale=0.03, k_global_scale=0.004,
                                 v_global_scale=0.003)
        c.write(0, k, v, slots)
        caches.append(c)
    return caches


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_write_head_strided_views_equal_packed_rows(rng, fmt):
    B, H, S, D = 5, 3, 7, 64
    k4, v4 = _head_major(rng, B, H, S, D)
    # transformers' decode step: the new token of each sequence, key[:, :, -1] (no copy)
    ks, vs = k4[:, :, -1], v4[:, :, -1]
    assert ks.strides == (H * S * D * 2, S * D * 2, 2)
    slots = rng.permutation(96)[:B].astype(np.int64)
    a, b = _write_both(fmt, H, D, ks, vs, np.ascontiguousarray(ks), np.ascontiguousarray(vs), slots)
    assert np.array_equal(a.k(0), b.k(0)) and np.array_equal(a.v(0), b.v(0))
    assert a.saturated() == b.saturated()
    # a prefill chunk: all S tokens of every sequence, (B, H, S, D), slots (B, S), token b*S + s
    slots = rng.permutation(96)[:B * S].astype(np.int64)
    packed = (np.ascontiguousarray(k4.transpose(0, 2, 1, 3)).reshape(B * S, H, D),
              np.ascontiguousarray(v4.transpose(0, 2, 1, 3)).reshape(B * S, H, D))
    a, b = _write_both(fmt, H, D, k4, v4, packed[0], packed[1], slots.reshape(B, S))
    assert np.array_equal(a.k(0), b.k(0)) and np.array_equal(a.v(0), b.v(0))
    # the same tokens as a (B, S, H, D) projection transposed to (B, H, S, D): evenly spaced tokens
    kt, vt = packed[0].reshape(B, S, H, D).transpose(0, 2, 1, 3), packed[1].reshape(B, S, H, D).transpose(0, 2, 1, 3)
    c, _ = _write_both(fmt, H, D, kt, vt, kt, vt, slots)
    assert np.array_equal(c.k(0), b.k(0)) and np.array_equal(c.v(0), b.v(0))
    # one sequence's tokens as a permuted (S, H, D) view of its (H, S, D) tensor; K strided, V packed
    slots = rng.permutation(96)[:S].astype(np.int64)
    a, b = _write_both(fmt, H, D, k4[2].transpose(1, 0, 2), packed[1][2 * S:3 * S],
                       packed[0][2 * S:3 * S], packed[1][2 * S:3 * S], slots)
    assert np.array_equal(a.k(0), b.k(0)) and np.array_equal(a.v(0), b.v(0))


def test_write_rejects_bad_strided_inputs(rng):
    cache = metrale.PagedKVCache("fp8", 4, 16, 2, 64)
    k4, v4 = _head_major(rng, 3, 2, 4, 64)
    slots = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match="'key'"):  # head_dim not contiguous
        cache.write(0, k4[:, :, -1, ::2], v4[:, :, -1, ::2], slots)
    with pytest.raises(ValueError, match="'key'"):  # wrong number of heads
        cache.write(0, k4[:, :1, -1], v4[:, :1, -1], slots)
    with pytest.raises(ValueError, match="'slot_mapping'"):  # (B, S) needs B*S slots
        cache.write(0, k4, v4, slots)
    buf = np.zeros((3, 2, 68), dtype=np.uint16)  # heads 68 elements apart: not a multiple of 8
    with pytest.raises(ValueError, match="key_head_stride"):
        cache.write(0, buf[:, :, :64], v4[:, :, -1], slots)


# --------------------------------------------- saturation counts


def _saturated_ref(fmt, x_bits, scale, gscale):
    x = (np.asarray(x_bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    if fmt == "fp8":
        q = x * np.float32(np.float32(1.0) / np.float32(scale))
    elif fmt == "nvfp4":
        q = x / (np.float32(6.0) * np.float32(gscale))
    else:
        return 0
    return int(np.count_nonzero(np.abs(q[~np.isnan(q)]) > 464))  # past 448's rounding interval


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_values_past_the_calibrated_absmax_are_counted(rng, fmt):
    cache = metrale.PagedKVCache(fmt, 8, 16, 2, 64, num_layers=2)
    prompt_k, prompt_v = make_kv(rng, 40, 2, 64)
    cache.calibrate(prompt_k, prompt_v)
    slots = np.arange(40, dtype=np.int64)
    cache.write(0, prompt_k, prompt_v, slots)
    assert cache.saturated(0) == (0, 0)  # the prompt fits its own calibration
    # decode-time K reaching 1.05x the prompt's absmax
    # (V, the row holding the absmax among them) and K three times past it
    k = ref.bf16_bits(ref.bf16_value(make_kv(rng, 10, 2, 64)[0]) * 3.0)
    top = int(np.argmax(np.abs(ref.bf16_value(prompt_v)).reshape(40, -1).max(axis=1)))
    v = ref.bf16_bits(ref.bf16_value(np.roll(prompt_v, -top, axis=0)[:10]) * 1.05)
    s = cache.scales(0)
    want = (_saturated_ref(fmt, k, s["k_scale"], s["k_global_scale"]),
            _saturated_ref(fmt, v, s["v_scale"], s["v_global_scale"]))
    if fmt != "bf16":
        assert want[0] > 0 and want[1] > 0
    cache.write(0, k, v, np.arange(40, 50, dtype=np.int64))
    cache.write(1, k, v, np.array([-1] * 10, dtype=np.int64))  # padding: nothing written, nothing counted
    assert cache.saturated(0) == want
    assert cache.saturated(1) == (0, 0)
    assert cache.saturated() == want
    assert cache.saturation_counters.shape == (2, 2)
    # the op-level counter accumulates, K then V
    counter = np.array([5, 6], dtype=np.int64)
    metrale.reshape_and_cache(k, v, np.arange(50, 60, dtype=np.int64), cache.layer(1), saturated=counter)
    assert tuple(counter) == (5 + want[0], 6 + want[1])
    cache.reset_saturated(0)
    assert cache.saturated() == (0, 0)
    with pytest.raises(TypeError, match="'saturated'"):
        metrale.reshape_and_cache(k, v, slots[:10], cache.layer(1), saturated=np.zeros(2, np.int32))
    with pytest.raises(ValueError, match="'saturated'"):
        metrale.reshape_and_cache(k, v, slots[:10], cache.layer(1), saturated=np.zeros(1, np.int64))


def test_absmax_and_calibration_of_strided_views(rng):
    B, H, S, D = 4, 3, 5, 64
    k4, v4 = _head_major(rng, B, H, S, D)
    cases = [k4[:, :, -1],                    # transformers' decode slice: one call
             k4,                              # contiguous
             k4[:, :, 1:3],                   # a window of positions
             k4[1].transpose(1, 0, 2),        # (S, H, D) view: a call per head
             k4.transpose(0, 2, 1, 3)[:, ::2]]  # every other position, token-major
    for x in cases:
        want = np.abs(ref.bf16_value(x)).max()
        assert metrale.bf16_absmax(x) == want, x.strides
    cache = metrale.PagedKVCache("fp8", 4, 16, H, D)
    s = cache.calibrate(k4[:, :, -1], v4[:, :, -1])
    assert s["k_scale"] == np.float32(np.abs(ref.bf16_value(k4[:, :, -1])).max()) / np.float32(448)
    assert s["v_scale"] == np.float32(np.abs(ref.bf16_value(v4[:, :, -1])).max()) / np.float32(448)


def test_nvfp4_adaptive_scales_decode_by_the_same_rule_and_cut_the_error(rng):
    """nvfp4_scales="adaptive" (docs/nvfp4_scales.md): the pages decode by the unchanged
    x = e2m1 * s * g (the reference dequantiser), closer to the written values than max6's."""
    N, H, D = 512, 2, 64
    x = rng.standard_normal((2, N, H, D)).astype(np.float32)
    k, v = metrale.to_bf16(x[0]), metrale.to_bf16(x[1])
    exact = ref.bf16_value(np.stack([k, v]))
    err = {}
    for rule in ("max6", "adaptive"):
        cache = metrale.PagedKVCache("nvfp4", N // 16, 16, H, D, nvfp4_scales=rule)
        assert cache.layout.nvfp4_scales == rule and rule in repr(cache.layout)
        cache.write(0, k, v, np.arange(N, dtype=np.int64))
        got = np.stack([ref.dequant_cache("nvfp4", cache.k(0), cache.layout),
                        ref.dequant_cache("nvfp4", cache.v(0), cache.layout)]).reshape(exact.shape)
        err[rule] = np.sqrt(np.mean((got - exact) ** 2) / np.mean(exact ** 2))
    # Gaussian groups: about 9.5% relative RMS error with max6, 8.7% adaptive.
    assert 0.09 < err["max6"] < 0.10 and err["adaptive"] < 0.95 * err["max6"], err
    with pytest.raises(ValueError, match="nvfp4_scales"):
        metrale.make_layout("fp8", 4, 16, H, D, nvfp4_scales="adaptive")
    with pytest.raises(ValueError, match="max6"):
        metrale.make_layout("nvfp4", 4, 16, H, D, nvfp4_scales="max4")
    with pytest.raises(TypeError, match="nvfp4_scales"):
        metrale.make_layout("nvfp4", 4, 16, H, D, nvfp4_scales=4)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("mag", [1e-30, 1e-37, 1e-39])
def test_tiny_values_calibrate_to_finite_attention(rng, fmt, mag):
    """K/V far below the formats' normal range (bf16 keeps them): FP8's calibrated scale
    absmax / 448 would be an f32 subnormal whose 1 / scale is inf (codes of 0 * inf were NaN);
    it floors at the smallest normal f32, and the output is finite. A subnormal FP8 scale set
    by hand is refused by name."""
    T, H, D, B = 32, 1, 64, 16
    k = metrale.to_bf16((rng.standard_normal((T, H, D)) * mag).astype(np.float32))
    v = metrale.to_bf16((rng.standard_normal((T, H, D)) * mag).astype(np.float32))
    k[0, 0, 0] = v[0, 0, 0] = 0
    cache = metrale.PagedKVCache(fmt, 2, B, H, D)
    cache.calibrate(k, v)
    cache.write(0, k, v, np.arange(T, dtype=np.int64))
    q = metrale.to_bf16(rng.standard_normal((1, 2, D)).astype(np.float32))
    out = metrale.attention(q, cache.layer(0), np.array([[0, 1]], np.int32), np.array([T], np.int32))
    assert np.isfinite(ref.bf16_value(out)).all()
    if fmt == "fp8":
        with pytest.raises(ValueError, match="k_scale"):
            cache.set_scales(0, k_scale=1e-39, force=True)
