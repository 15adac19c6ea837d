"""The metrale Python package on the CUDA backend with torch tensors, against
a float64 torch reference over the dequantised cache; GPU and CPU cache
bytes compared bit for bit; a decode captured in a torch.cuda.CUDAGraph and
replayed with changed sequence lengths. Skipped without torch, CUDA or an
sm_90 GPU usable by this build."""

import math
import zlib
import os

import numpy as np
import pytest

import metrale
import metrale_ref as ref

torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or not metrale.cuda_available():
    pytest.skip("no CUDA device usable by metrale (sm_90) / torch.cuda", allow_module_level=True)

SEED = int(os.environ.get("METRALE_TEST_SEED", np.random.SeedSequence().entropy % (2**32)))
DEV = "cuda"


@pytest.fixture
def rng(request):
    seed = (SEED + zlib.crc32(request.node.name.encode())) % (2**32)
    print(f"seed {seed} (METRALE_TEST_SEED={SEED})")
    return np.random.default_rng(seed)


def bits_to_torch(bits):
    """uint16 bf16 patterns (NumPy) -> torch.bfloat16 on the GPU."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16).to(DEV)


def torch_to_bits(t):
    return t.detach().cpu().view(torch.int16).numpy().view(np.uint16)


class GpuBatch:
    def __init__(self, rng, fmt, *, lens, Hq=8, Hkv=2, D=128, B=16, num_layers=1, spare_blocks=4, extra_len=0):
        self.fmt, self.Hq, self.Hkv, self.D, self.B = fmt, Hq, Hkv, D, B
        self.seq_lens_np = np.asarray(lens, dtype=np.int32)
        S = len(lens)
        mb = -(-(int(self.seq_lens_np.max()) + extra_len) // B)
        num_blocks = S * mb + spare_blocks
        self.cache = metrale.PagedKVCache(fmt, num_blocks, B, Hkv, D, num_layers=num_layers, device=DEV)
        self.cpu_cache = metrale.PagedKVCache(fmt, num_blocks, B, Hkv, D, num_layers=num_layers)
        self.bt_np = rng.permutation(num_blocks)[: S * mb].astype(np.int32).reshape(S, mb)
        # every slot of every sequence's table row, so lengths may grow up to mb * B
        pos = np.arange(mb * B)
        self.slots_np = np.concatenate([self.bt_np[i, pos // B].astype(np.int64) * B + pos % B for i in range(S)])
        n = len(self.slots_np)
        k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        k[:, :, rng.choice(D, 3, replace=False)] *= 12
        v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
        self.k_bits, self.v_bits = ref.bf16_bits(k), ref.bf16_bits(v)
        key, value = bits_to_torch(self.k_bits), bits_to_torch(self.v_bits)
        slots = torch.from_numpy(self.slots_np).to(DEV)
        self.cache.calibrate(key, value)
        self.cpu_cache.calibrate(self.k_bits, self.v_bits)
        for layer in range(num_layers):
            assert self.cache.write(layer, key, value, slots) is None
            self.cpu_cache.write(layer, self.k_bits, self.v_bits, self.slots_np)
        torch.cuda.synchronize()
        self.q_np = ref.bf16_bits(rng.standard_normal((S, Hq, D)))
        self.q = bits_to_torch(self.q_np)
        self.block_tables = torch.from_numpy(self.bt_np).to(DEV)
        self.seq_lens = torch.from_numpy(self.seq_lens_np).to(DEV)

    def reference(self, q_np=None, seq_lens=None, window=0, layer=0):
        """float64 torch attention over the dequantised GPU cache."""
        q_np = self.q_np if q_np is None else q_np
        seq_lens = self.seq_lens_np if seq_lens is None else seq_lens
        s = self.cache.scales(layer)
        lay = self.cache.layout
        kf = torch.from_numpy(ref.dequant_cache(self.fmt, self.cache.k(layer).cpu().numpy(), lay, s["k_scale"],
                                                s["k_global_scale"])).to(DEV)
        vf = torch.from_numpy(ref.dequant_cache(self.fmt, self.cache.v(layer).cpu().numpy(), lay, s["v_scale"],
                                                s["v_global_scale"])).to(DEV)
        q = torch.from_numpy(ref.bf16_value(q_np)).to(DEV)
        S, Hq, D = q.shape
        g = Hq // self.Hkv
        out = torch.zeros((S, Hq, D), dtype=torch.float64, device=DEV)
        bt = torch.from_numpy(self.bt_np).to(DEV).long()
        for i in range(S):
            L = int(seq_lens[i])
            if L == 0:
                continue
            start = max(0, L - window) if window > 0 else 0
            pos = torch.arange(start, L, device=DEV)
            pages = bt[i, pos // self.B]
            K = kf[pages, pos % self.B].repeat_interleave(g, dim=1)  # [n, Hq, D]
            V = vf[pages, pos % self.B].repeat_interleave(g, dim=1)
            logits = torch.einsum("nhd,hd->hn", K, q[i]) / math.sqrt(D)
            out[i] = torch.einsum("hn,nhd->hd", torch.softmax(logits, dim=-1), V)
        return out


def check(out, expect, tol=1e-2):
    o = out.double()
    assert torch.isfinite(o).all(), "NaN/Inf or unwritten output"
    num = (o - expect).norm(dim=-1)
    den = expect.norm(dim=-1)
    err = torch.where(den > 0, num / den.clamp_min(1e-300), num).max().item()
    assert err <= tol, f"relative L2 error {err:.3g} > {tol}"


def poisoned(S, Hq, D):
    return torch.full((S, Hq, D), float("nan"), dtype=torch.bfloat16, device=DEV)


FORMATS = ["bf16", "fp8", "nvfp4"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_cache_bytes_equal_cpu(rng, fmt):
    b = GpuBatch(rng, fmt, lens=[100, 37, 0, 64], D=128)
    assert b.cache.scales(0) == b.cpu_cache.scales(0)
    assert np.array_equal(b.cache.k(0).cpu().numpy(), b.cpu_cache.k(0))
    assert np.array_equal(b.cache.v(0).cpu().numpy(), b.cpu_cache.v(0))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("window", [0, 100])
@pytest.mark.parametrize("Hq,Hkv,D,B", [(32, 8, 128, 16), (8, 8, 64, 32), (16, 2, 256, 64)])
def test_gpu_planner_decode(rng, fmt, window, Hq, Hkv, D, B):
    lens = [int(x) for x in rng.integers(0, 700, 6)] + [1500]
    b = GpuBatch(rng, fmt, lens=lens, Hq=Hq, Hkv=Hkv, D=D, B=B, num_layers=2)
    plan = metrale.Planner(len(lens), Hq, b.cache.layout, max(lens), window, DEV)
    for layer in range(2):
        out = poisoned(len(lens), Hq, D)
        plan.run(b.q, b.cache.layer(layer), b.block_tables, b.seq_lens, out)
        torch.cuda.synchronize()
        check(out, b.reference(window=window, layer=layer))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_splits", [2, 5, 16])
def test_gpu_splitk_equals_single_pass(rng, fmt, num_splits):
    lens = [3000, 17, 0, 900, 1024]
    b = GpuBatch(rng, fmt, lens=lens, Hq=16, Hkv=4, D=128)
    S = len(lens)
    single = poisoned(S, 16, 128)
    metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, single, sliding_window=700)
    ws = torch.full((metrale.splitk_workspace_bytes(S, 16, 128, num_splits) // 4,), float("nan"),
                    dtype=torch.float32, device=DEV)
    metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, sliding_window=700, num_splits=num_splits,
                      merge="states_only", workspace=ws)
    out = poisoned(S, 16, 128)
    metrale.reduce_states(ws, out, num_splits)
    torch.cuda.synchronize()
    expect = b.reference(window=700)
    check(single, expect)
    check(out, expect)


def test_gpu_calibration_absmax(rng):
    x = rng.standard_normal((64, 4, 128)).astype(np.float32) * 3
    bits = ref.bf16_bits(x)
    t = bits_to_torch(bits)
    acc = metrale.bf16_absmax(t)  # device float32[1], no sync
    assert acc.is_cuda
    assert acc.item() == np.abs(ref.bf16_value(bits)).max()
    big = t.clone()
    big[5, 1, 7] = -1000.0
    metrale.bf16_absmax(big[:, 1, :], acc)  # strided rows, folded into acc
    assert acc.item() == 1000.0


def test_gpu_bad_inputs(rng):
    b = GpuBatch(rng, "fp8", lens=[40, 20], D=64)
    view = b.cache.layer(0)
    with pytest.raises(ValueError, match=r"'block_tables' is on cpu but 'q' is on cuda"):
        metrale.attention(b.q, view, b.block_tables.cpu(), b.seq_lens)
    with pytest.raises(TypeError, match=r"'q'.*bfloat16.*float32"):
        metrale.attention(b.q.float(), view, b.block_tables, b.seq_lens)
    plan = metrale.Planner(2, 8, b.cache.layout, 40, device="cpu")
    with pytest.raises(ValueError, match=r"'q' is on cuda:0; expected cpu"):
        plan.run(b.q, view, b.block_tables, b.seq_lens)


@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_decode_in_cuda_graph(rng, fmt):
    """Capture plan.run in a CUDA graph, then replay it with new lengths and
    queries copied into the same tensors."""
    Hq, Hkv, D = 32, 8, 128
    lens0 = [900, 50, 1, 333]
    b = GpuBatch(rng, fmt, lens=lens0, Hq=Hq, Hkv=Hkv, D=D, extra_len=1200)
    max_len = b.bt_np.shape[1] * b.B
    plan = metrale.Planner(len(lens0), Hq, b.cache.layout, max_len, 0, DEV)
    S = len(lens0)
    out = poisoned(S, Hq, D)
    q = b.q.clone()
    seq_lens = b.seq_lens.clone()
    view = b.cache.layer(0)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        plan.run(q, view, b.block_tables, seq_lens, out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    check(out, b.reference())

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, view, b.block_tables, seq_lens, out)

    for lens in ([1000, 2000, 0, 16], [max_len, 1, 777, 64], lens0):
        new_q = ref.bf16_bits(rng.standard_normal((S, Hq, D)))
        q.copy_(bits_to_torch(new_q))
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, b.reference(q_np=new_q, seq_lens=np.asarray(lens)))


def test_gpu_run_on_explicit_stream(rng):
    b = GpuBatch(rng, "nvfp4", lens=[500, 20], D=128, Hq=16, Hkv=8)
    s = torch.cuda.Stream()
    out = poisoned(2, 16, 128)
    s.wait_stream(torch.cuda.current_stream())
    metrale.attention(b.q, b.cache.layer(0), b.block_tables, b.seq_lens, out, stream=s)
    s.synchronize()
    check(out, b.reference())


class CaiOnly:
    """An array known only by __cuda_array_interface__ (as Numba's are)."""

    def __init__(self, t):
        self._t = t
        self.shape = tuple(t.shape)

    @property
    def __cuda_array_interface__(self):
        return self._t.__cuda_array_interface__


def test_gpu_cuda_array_interface_inputs(rng):
    b = GpuBatch(rng, "fp8", lens=[300, 45, 0], D=128, Hq=8, Hkv=2)
    out = poisoned(3, 8, 128)
    metrale.attention(b.q, b.cache.layer(0), CaiOnly(b.block_tables), CaiOnly(b.seq_lens), out)
    torch.cuda.synchronize()
    check(out, b.reference())


@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_head_strided_writes_and_saturation_equal_cpu(rng, fmt):
    """transformers' (B, Hkv, S, D) tensors written without a copy (the decode
    slice key[:, :, -1] and the whole 4-D tensor): the same bytes and the same
    saturation counts as the CPU backend, with scales calibrated on a smaller
    range so that values saturate."""
    B, H, S, D = 6, 4, 5, 128
    k = rng.standard_normal((B, H, S, D)).astype(np.float32)
    k[..., rng.choice(D, 3, replace=False)] *= 12
    v = rng.standard_normal((B, H, S, D)).astype(np.float32)
    k_bits, v_bits = ref.bf16_bits(k), ref.bf16_bits(v)
    kt, vt = bits_to_torch(k_bits), bits_to_torch(v_bits)
    scales = dict(k_scale=4.0 / 448, v_scale=2.0 / 448, k_global_scale=4.0 / 2688, v_global_scale=2.0 / 2688)
    gpu = metrale.PagedKVCache(fmt, 8, 16, H, D, device=DEV, **scales)
    cpu = metrale.PagedKVCache(fmt, 8, 16, H, D, **scales)
    slots = rng.permutation(128)[: B + B * S].astype(np.int64)
    gpu.write(0, kt[:, :, -1], vt[:, :, -1], torch.from_numpy(slots[:B]).to(DEV))
    cpu.write(0, k_bits[:, :, -1], v_bits[:, :, -1], slots[:B])
    gpu.write(0, kt, vt, torch.from_numpy(slots[B:].reshape(B, S)).to(DEV))
    cpu.write(0, k_bits, v_bits, slots[B:].reshape(B, S))
    torch.cuda.synchronize()
    assert np.array_equal(gpu.k(0).cpu().numpy(), cpu.k(0))
    assert np.array_equal(gpu.v(0).cpu().numpy(), cpu.v(0))
    assert gpu.saturated() == cpu.saturated()
    if fmt != "bf16":
        assert min(cpu.saturated()) > 0
    acc = metrale.bf16_absmax(kt[:, :, -1])
    assert acc.item() == np.abs(ref.bf16_value(k_bits[:, :, -1])).max()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("window", [0, 333])
def test_gpu_prefill_kernel_long_runs(rng, fmt, window):
    """Prompts and a chunk over a cached prefix (runs of 300-2100 rows) through the
    planner's kernel for long runs (the prefill kernel on the GPU; FP8 / NVFP4 pages
    staged as bf16 in the planner's workspace, runs of 2048+ rows): sampled rows
    against the float64 reference (each row is the decode of its prefix, window
    per row), every row against the CPU backend, and the same with 5 splits forced."""
    lens = [2100, 1700, 300]
    runs = [2100, 400, 300]  # two prompts, a chunk of 400 over a 1300-token prefix
    Hq, Hkv, D = 16, 4, 128
    b = GpuBatch(rng, fmt, lens=lens, Hq=Hq, Hkv=Hkv, D=D)
    q_start_np = np.concatenate([[0], np.cumsum(runs)]).astype(np.int32)
    rows = int(q_start_np[-1])
    q_np = ref.bf16_bits(rng.standard_normal((rows, Hq, D)))
    q, q_start = bits_to_torch(q_np), torch.from_numpy(q_start_np).to(DEV)
    S = len(lens)
    long_plan = metrale.Planner(S, Hq, b.cache.layout, max(lens), sliding_window=window, device=DEV,
                                max_q_len=max(runs), num_q_rows=rows)
    if DEV == "cuda":
        assert long_plan.plan.kernel == "prefill", long_plan.plan
        # A single pass needs a workspace only for the staged pages.
        assert (long_plan.plan.workspace_bytes > 0) == (fmt != "bf16"), long_plan.plan
    out = poisoned(rows, Hq, D)
    long_plan.run(q, b.cache.layer(0), b.block_tables, b.seq_lens, out, q_start=q_start)
    # The CPU backend over a host copy of the cache: the same rows.
    other = metrale.attention(q_np, b.cpu_cache.layer(0), b.bt_np, b.seq_lens_np, q_start=q_start_np,
                              sliding_window=window)
    other = torch.from_numpy(metrale.from_bf16(other)).to(DEV)
    if DEV == "cuda":
        torch.cuda.synchronize()
    check(out, other.double(), tol=2e-2)
    # Split-K forced (records through the planner's workspace, then the reduce).
    split_plan = metrale.Planner(S, Hq, b.cache.layout, max(lens), sliding_window=window, device=DEV,
                                 max_q_len=max(runs), num_q_rows=rows, num_splits=5)
    assert split_plan.num_splits == 5 and split_plan.plan.merge == "workspace", split_plan.plan
    split = poisoned(rows, Hq, D)
    split_plan.run(q, b.cache.layer(0), b.block_tables, b.seq_lens, split, q_start=q_start)
    if DEV == "cuda":
        torch.cuda.synchronize()
    check(split, other.double(), tol=2e-2)
    # Sampled rows: row j of sequence i is the decode of the prefix of length L - n + j + 1.
    for j_frac in (0.0, 0.37, 0.81, 1.0):
        sample_q = np.empty((S, Hq, D), dtype=np.uint16)
        prefix = np.empty(S, dtype=np.int32)
        picked = []
        for i in range(S):
            j = min(runs[i] - 1, int(j_frac * (runs[i] - 1)))
            row = int(q_start_np[i]) + j
            sample_q[i] = q_np[row]
            prefix[i] = lens[i] - runs[i] + j + 1
            picked.append(row)
        expect = b.reference(q_np=sample_q, seq_lens=prefix, window=window)
        check(out[picked], expect)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("run", [1, 7, 300])
def test_gpu_head_major_q_equals_packed_q(rng, fmt, run):
    """transformers' batch-1 query (1, heads, tokens, D) read as (tokens, heads, D) rows with
    strided heads: the decode, runs and prefill kernels give the packed q's rows, bit for bit."""
    lens = [400] if run > 1 else [400, 90, 3]
    b = GpuBatch(rng, fmt, lens=lens, Hq=32, Hkv=8, D=64)
    rows = run if run > 1 else len(lens)
    packed = bits_to_torch(ref.bf16_bits(rng.standard_normal((rows, 32, 64))))
    hm = packed.transpose(0, 1).contiguous().transpose(0, 1)
    assert hm.stride() == (64, rows * 64, 1)
    q_start = None if run == 1 else torch.tensor([0, run], dtype=torch.int32, device=DEV)
    kw = dict(q_start=q_start, max_q_len=run, sliding_window=128)
    want = metrale.attention(packed, b.cache.layer(0), b.block_tables, b.seq_lens, **kw)
    got = metrale.attention(hm, b.cache.layer(0), b.block_tables, b.seq_lens, **kw)
    four = metrale.attention(hm.transpose(0, 1)[None], b.cache.layer(0), b.block_tables, b.seq_lens, **kw)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(four, want)
    cpu = metrale.attention(torch_to_bits(packed), b.cpu_cache.layer(0), b.bt_np, b.seq_lens_np,
                            q_start=None if q_start is None else q_start.cpu().numpy(), sliding_window=128)
    check(want, torch.from_numpy(metrale.from_bf16(cpu)).to(DEV).double(), tol=2e-2)


def test_gpu_forced_splits_past_the_workspace_bound_raise_before_allocating():
    """Planner(..., num_splits=64) over 130 sequences of up to 4000 rows asked torch for hundreds
    of GiB; the plan now refuses with ValueError naming the bytes, before any allocation."""
    layout = metrale.make_layout("fp8", 4096, 16, 8, 128)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with pytest.raises(ValueError, match=r"bytes"):
        metrale.Planner(130, 32, layout, 4000, device=DEV, max_q_len=4000, num_splits=64)
    assert torch.cuda.memory_allocated() == before
    own = metrale.Planner(130, 32, layout, 4000, device=DEV, max_q_len=4000)
    assert own.workspace_bytes <= metrale.planner.DEFAULT_MAX_WORKSPACE_BYTES, own.plan
