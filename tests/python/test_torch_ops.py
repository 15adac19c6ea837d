"""metrale.torch_ops: the torch.library operators (cache write, attention) against
the plain Python API and the float64 reference, under torch.library.opcheck, inside
torch.compile(fullgraph=True) with no graph break, and (on a GPU) captured in a CUDA graph.
CPU tensors run the CPU backend. Skipped without torch."""

import math
import os
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import metrale  # noqa: E402
import metrale.torch_ops as mto  # noqa: E402
import metrale_ref as ref  # noqa: E402

SEED = int(os.environ.get("METRALE_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))
FORMATS = ["bf16", "fp8", "nvfp4"]


@pytest.fixture
def rng(request):
    seed = (SEED + zlib.crc32(request.node.name.encode())) % (2**32)
    print(f"seed {seed} (METRALE_TEST_SEED={SEED})")
    return np.random.default_rng(seed)


def bf16(x, device="cpu"):
    return torch.from_numpy(np.ascontiguousarray(ref.bf16_bits(x)).view(np.int16)).view(torch.bfloat16).to(device)


class Problem:
    """A paged batch in torch tensors: pages shuffled, lens mixed, K/V not yet written."""

    def __init__(self, rng, fmt, *, lens=(37, 16, 1, 70), Hq=8, Hkv=2, D=64, B=16, device="cpu"):
        self.fmt, self.Hq, self.Hkv, self.D, self.B = fmt, Hq, Hkv, D, B
        lens = np.asarray(lens, dtype=np.int32)
        S = len(lens)
        mb = -(-int(lens.max()) // B)
        nb = S * mb + 2
        self.layout = metrale.make_layout(fmt, nb, B, Hkv, D)
        table = rng.permutation(nb)[: S * mb].astype(np.int32).reshape(S, mb)
        slots = np.concatenate([table[i, np.arange(n) // B].astype(np.int64) * B + np.arange(n) % B
                                for i, n in enumerate(lens)])
        n = len(slots)
        k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        k[:, :, rng.choice(D, 3, replace=False)] *= 12
        v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        self.key, self.value = bf16(k, device), bf16(v, device)
        self.slots = torch.from_numpy(slots).to(device)
        self.table = torch.from_numpy(table).to(device)
        self.lens = torch.from_numpy(lens).to(device)
        self.lens_np = lens
        self.q = bf16(rng.standard_normal((S, Hq, D)), device)
        self.k_cache = torch.zeros((nb, self.layout.page_stride_bytes), dtype=torch.uint8, device=device)
        self.v_cache = torch.zeros_like(self.k_cache)
        kmax, vmax = float(self.key.float().abs().max()), float(self.value.float().abs().max())
        scales = metrale.kv_scales_from_absmax(fmt, kmax, vmax)
        self.scales = tuple(scales.values()) if scales else (1.0, 1.0)  # the format's two per-tensor scales

    @property
    def spec(self):
        """The operators' cache description: format, block_size, num_kv_heads, k_scale, v_scale."""
        return (self.fmt, self.B, self.Hkv) + tuple(self.scales)

    def view(self):
        names = metrale.view.tensor_scale_names(self.layout.format)
        return metrale.KVCacheView(self.layout, self.k_cache, self.v_cache, **dict(zip(names, self.scales)))

    def write(self):
        torch.ops.metrale.reshape_and_cache(self.key, self.value, self.slots, self.k_cache, self.v_cache, *self.spec)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ops_equal_the_python_api(rng, fmt):
    p = Problem(rng, fmt)
    p.write()
    k_op, v_op = p.k_cache.clone(), p.v_cache.clone()
    p.k_cache.zero_()
    p.v_cache.zero_()
    metrale.reshape_and_cache(p.key, p.value, p.slots, p.view())
    assert torch.equal(k_op, p.k_cache) and torch.equal(v_op, p.v_cache)
    out, lse = torch.ops.metrale.attention(p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec)
    want = metrale.attention(p.q, p.view(), p.table, p.lens)
    assert torch.equal(out, want) and lse.shape == (0,)
    # one row per sequence as runs is decode; lse returned when asked
    q_start = torch.arange(len(p.lens_np) + 1, dtype=torch.int32)
    out1, lse1 = torch.ops.metrale.attention(p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec, q_start=q_start,
                                             return_lse=True)
    want1, want_lse = metrale.attention(p.q, p.view(), p.table, p.lens, q_start=q_start, return_lse=True)
    assert torch.equal(out1, want) and torch.equal(out1, want1) and torch.equal(lse1, want_lse)
    assert lse1.shape == (len(p.lens_np), p.Hq)


def test_decode_op_matches_float64_reference(rng):
    p = Problem(rng, "bf16")
    p.write()
    out, _ = torch.ops.metrale.attention(p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec)
    kf = ref.dequant_cache("bf16", p.k_cache.numpy(), p.layout, 1.0, 1.0)
    vf = ref.dequant_cache("bf16", p.v_cache.numpy(), p.layout, 1.0, 1.0)
    q_bits = p.q.view(torch.int16).numpy().view(np.uint16)
    want = ref.decode_ref(q_bits, kf, vf, p.table.numpy(), p.lens_np, p.B, 1 / math.sqrt(p.D), 0)
    got = out.float().numpy()
    err = np.abs(got - want).max() / max(1e-6, np.abs(want).max())
    assert err < 2 ** -7, err


@pytest.mark.parametrize("window,softcap,sinks", [(0, 0.0, False), (5, 0.0, False), (0, 30.0, True)])
def test_attention_op_runs_equal_python_attention(rng, window, softcap, sinks):
    p = Problem(rng, "fp8")
    p.write()
    runs = np.array([3, 1, 1, 8], dtype=np.int32)
    q_start = torch.from_numpy(np.concatenate([[0], np.cumsum(runs)]).astype(np.int32))
    q = bf16(rng.standard_normal((int(runs.sum()), p.Hq, p.D)))
    s = torch.from_numpy(rng.standard_normal(p.Hq).astype(np.float32)) if sinks else None
    out, lse = torch.ops.metrale.attention(q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec, q_start=q_start,
                                           max_q_len=int(runs.max()), sliding_window=window, sm_scale=0.125,
                                           sinks=s, softcap=softcap, return_lse=True)
    want, want_lse = metrale.attention(q, p.view(), p.table, p.lens, q_start=q_start, sliding_window=window,
                                       sm_scale=0.125, sinks=s, softcap=softcap, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    # q as a head-major view (transformers' batch-1 query): the same rows
    hm = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert hm.stride(1) == q.shape[0] * p.D
    out_hm, _ = torch.ops.metrale.attention(hm, p.k_cache, p.v_cache, p.table, p.lens, *p.spec, q_start=q_start,
                                            sliding_window=window, sm_scale=0.125, sinks=s, softcap=softcap)
    assert torch.equal(out_hm, out)


def test_schema_is_typed():
    """The format a string, the scales floats, lse returned: no list of int codes."""
    schema = str(torch.ops.metrale.attention.default._schema)
    assert "str format" in schema and "float k_scale" in schema and "int[]" not in schema, schema
    assert "-> (Tensor, Tensor)" in schema, schema


def test_plan_cache_drops_the_least_recently_used():
    cache = mto._PlanCache(capacity=2)
    made = []
    for key in ("a", "b", "a", "c"):  # "a" used again before "c" arrives: "b" goes
        cache.get((key,), lambda k=key: made.append(k) or k)
    assert made == ["a", "b", "c"] and len(cache) == 2
    assert ("a",) in cache and ("c",) in cache and ("b",) not in cache


def test_mutated_arguments_have_no_default():
    """Every argument an operator mutates is required: torch 2.11's ADInplaceOrView kernel
    indexes the call's positional arguments by the schema's mutated indices, so a mutated
    argument left to its default raised IndexError there (torch 2.15 checks the bound)."""
    for name in ("reshape_and_cache", "reshape_and_cache_counted", "attention"):
        schema = getattr(torch.ops.metrale, name).default._schema
        for arg in schema.arguments:
            if arg.alias_info is not None and arg.alias_info.is_write:
                assert not arg.has_default_value(), (name, arg.name)


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(rng, fmt):
    p = Problem(rng, fmt)
    sm = 1 / math.sqrt(p.D)
    torch.library.opcheck(torch.ops.metrale.reshape_and_cache.default,
                          (p.key, p.value, p.slots, p.k_cache, p.v_cache, *p.spec))
    p.write()
    torch.library.opcheck(torch.ops.metrale.attention.default, (p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec),
                          {"sm_scale": sm})
    q_start = torch.arange(len(p.lens_np) + 1, dtype=torch.int32)
    torch.library.opcheck(torch.ops.metrale.attention.default, (p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec),
                          {"q_start": q_start, "max_q_len": 1, "return_lse": True})


@pytest.mark.parametrize("fmt", FORMATS)
def test_write_op_counts_saturated_elements(rng, fmt):
    """The op's optional counters: scales calibrated for half the data's range clip the rest,
    counted by the rule of the Python API (FP8 |x| / scale > 464, NVFP4 |x| / (6 g) > 464)."""
    p = Problem(rng, fmt)
    p.scales = tuple(s / 2 for s in p.scales) if fmt != "bf16" else p.scales
    sat = torch.zeros(2, dtype=torch.int64)
    torch.ops.metrale.reshape_and_cache_counted(p.key, p.value, p.slots, p.k_cache, p.v_cache, *p.spec, sat)
    unit = {"bf16": None, "fp8": (p.scales[0], p.scales[1]), "nvfp4": (6 * p.scales[0], 6 * p.scales[1])}[fmt]
    if unit is None:
        assert sat.tolist() == [0, 0]
    else:
        expect = [int((p.key.float().abs() / unit[0] > 464).sum()), int((p.value.float().abs() / unit[1] > 464).sum())]
        assert sat.tolist() == expect and expect[0] > 0
    # The same through the Python API's counters.
    view = p.view()
    again = np.zeros(2, dtype=np.int64)
    metrale.reshape_and_cache(p.key, p.value, p.slots, view, saturated=torch.from_numpy(again))
    assert again.tolist() == sat.tolist()
    torch.library.opcheck(torch.ops.metrale.reshape_and_cache_counted.default,
                          (p.key, p.value, p.slots, p.k_cache, p.v_cache, *p.spec, sat))


def _decode_step(spec, sm):
    def step(q, key, value, slots, k_cache, v_cache, table, lens):
        torch.ops.metrale.reshape_and_cache(key, value, slots, k_cache, v_cache, *spec)
        out, _ = torch.ops.metrale.attention(q, k_cache, v_cache, table, lens + 1, *spec, sm_scale=sm)
        # torch work after the op joins the same graph; inductor may sum in another order than eager
        return out, out.float().sum(dim=-1)
    return step


@pytest.mark.parametrize("fmt,backend", [("bf16", "inductor"), ("nvfp4", "aot_eager")])
def test_compile_fullgraph_decode_step(rng, fmt, backend):
    """A decode step (write one token per sequence, attend) under torch.compile(fullgraph=True):
    no graph break, and the result of eager execution."""
    import torch._dynamo as dynamo
    p = Problem(rng, fmt, lens=(37, 16, 5, 70))
    p.write()
    # the next token of every sequence: slot at position lens[i]
    table, lens = p.table.numpy(), p.lens_np
    slots = torch.from_numpy(np.array([table[i, n // p.B] * p.B + n % p.B for i, n in enumerate(lens)],
                                      dtype=np.int64))
    key = bf16(rng.standard_normal((len(lens), p.Hkv, p.D)))
    value = bf16(rng.standard_normal((len(lens), p.Hkv, p.D)))
    step = _decode_step(p.spec, 1 / math.sqrt(p.D))
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    want = step(p.q, key, value, slots, kc, vc, p.table, p.lens)
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    got = compiled(p.q, key, value, slots, kc2, vc2, p.table, p.lens)
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    assert torch.equal(got[0], want[0])  # the op itself is deterministic
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)  # the mutation is kept through functionalisation


def _chunk_step(spec, sm, max_q_len):
    def step(q, key, value, slots, k_cache, v_cache, q_start, table, lens):
        torch.ops.metrale.reshape_and_cache(key, value, slots, k_cache, v_cache, *spec)
        out, _ = torch.ops.metrale.attention(q, k_cache, v_cache, table, lens, *spec, q_start=q_start,
                                             max_q_len=max_q_len, sm_scale=sm)
        return out, out.float().sum(dim=-1)
    return step


def _chunk_inputs(rng, p, runs, device="cpu"):
    """A chunked-prefill step's inputs: the last runs[i] tokens of sequence i are new
    (their K/V written by the step, their queries attend causally)."""
    table, lens = p.table.cpu().numpy(), p.lens_np
    slots = np.concatenate([table[i, np.arange(n - r, n) // p.B].astype(np.int64) * p.B + np.arange(n - r, n) % p.B
                            for i, (n, r) in enumerate(zip(lens, runs))])
    rows = int(sum(runs))
    key = bf16(rng.standard_normal((rows, p.Hkv, p.D)), device)
    value = bf16(rng.standard_normal((rows, p.Hkv, p.D)), device)
    q = bf16(rng.standard_normal((rows, p.Hq, p.D)), device)
    q_start = torch.from_numpy(np.concatenate([[0], np.cumsum(runs)]).astype(np.int32)).to(device)
    return q, key, value, torch.from_numpy(slots).to(device), q_start


@pytest.mark.parametrize("fmt,backend", [("fp8", "inductor"), ("bf16", "aot_eager")])
def test_compile_fullgraph_chunked_prefill_step(rng, fmt, backend):
    """A chunked-prefill step (write the chunk's K/V, attend its queries over the cache) under
    torch.compile(fullgraph=True): no graph break, and the result of eager execution."""
    import torch._dynamo as dynamo
    p = Problem(rng, fmt, lens=(37, 16, 5, 70))
    p.write()
    runs = [9, 16, 1, 33]
    q, key, value, slots, q_start = _chunk_inputs(rng, p, runs)
    step = _chunk_step(p.spec, 1 / math.sqrt(p.D), max(runs))
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    want = step(q, key, value, slots, kc, vc, q_start, p.table, p.lens)
    dynamo.reset()
    dynamo.utils.counters.clear()
    compiled = torch.compile(step, backend=backend, fullgraph=True)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    got = compiled(q, key, value, slots, kc2, vc2, q_start, p.table, p.lens)
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_ops_reject_bad_arguments(rng):
    p = Problem(rng, "bf16")
    fmt, bs, hkv, ks, vs = p.spec
    with pytest.raises(ValueError, match="format"):
        torch.ops.metrale.attention(p.q, p.k_cache, p.v_cache, p.table, p.lens, "int4", bs, hkv, ks, vs)
    with pytest.raises(ValueError, match="k_cache"):
        torch.ops.metrale.attention(p.q, p.k_cache.view(-1), p.v_cache, p.table, p.lens, *p.spec)
    with pytest.raises(ValueError, match="'q'"):
        torch.ops.metrale.attention(p.q.reshape(p.q.shape[0], -1), p.k_cache, p.v_cache, p.table, p.lens, *p.spec)
    with pytest.raises(ValueError, match="q_start"):
        torch.ops.metrale.attention(p.q, p.k_cache, p.v_cache, p.table, p.lens, *p.spec,
                                    q_start=torch.arange(5, dtype=torch.int32) * 2)


gpu = pytest.mark.skipif(not (torch.cuda.is_available() and metrale.cuda_available()),
                         reason="no CUDA device usable by metrale (sm_90)")


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_cuda_graph_captures_a_decode_step(rng, fmt):
    p = Problem(rng, fmt, device="cuda", lens=(300, 17, 1, 1000))
    p.write()
    table, lens = p.table.cpu().numpy(), p.lens_np
    slots = torch.from_numpy(np.array([table[i, n // p.B] * p.B + n % p.B for i, n in enumerate(lens)],
                                      dtype=np.int64)).cuda()
    key = bf16(rng.standard_normal((len(lens), p.Hkv, p.D)), "cuda")
    value = bf16(rng.standard_normal((len(lens), p.Hkv, p.D)), "cuda")
    step = _decode_step(p.spec, 1 / math.sqrt(p.D))
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    want = step(p.q, key, value, slots, kc, vc, p.table, p.lens)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: plans made outside the capture
        step(p.q, key, value, slots, p.k_cache.clone(), p.v_cache.clone(), p.table, p.lens)
    torch.cuda.current_stream().wait_stream(s)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = step(p.q, key, value, slots, kc2, vc2, p.table, p.lens)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # the same kernels replayed
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


@gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("runs", [(600, 2100, 1, 513), (600, 700, 1, 513), (128, 64, 1, 32), (30, 9, 1, 17)],
                         ids=["staged-chunks", "long-chunks", "mid-chunks", "short-chunks"])
def test_cuda_graph_captures_a_chunked_prefill_step(rng, fmt, runs):
    """A chunked-prefill step captured in a CUDA graph and replayed, with the planner's kernel:
    a chunk of 2048+ rows (the prefill kernel; FP8 / NVFP4 pages staged as bf16 in the
    op's workspace), long chunks (the prefill kernel), chunks of a few hundred packed rows
    (whichever the planner picks) and short ones (the runs kernel)."""
    p = Problem(rng, fmt, device="cuda", lens=(700, 3000, 1, 1400), Hq=16, Hkv=4, D=128)
    p.write()
    q, key, value, slots, q_start = _chunk_inputs(rng, p, runs, "cuda")
    step = _chunk_step(p.spec, 1 / math.sqrt(p.D), max(runs))
    kc, vc = p.k_cache.clone(), p.v_cache.clone()
    want = step(q, key, value, slots, kc, vc, q_start, p.table, p.lens)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: plans made outside the capture
        step(q, key, value, slots, p.k_cache.clone(), p.v_cache.clone(), q_start, p.table, p.lens)
    torch.cuda.current_stream().wait_stream(s)
    kc2, vc2 = p.k_cache.clone(), p.v_cache.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = step(q, key, value, slots, kc2, vc2, q_start, p.table, p.lens)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    assert not torch.isnan(got[0]).any()
