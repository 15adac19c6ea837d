#!/usr/bin/env python3
"""Peer decode attention on the same shapes as bench/metrale_bench, in the same run.

With --q-len N > 1: N query tokens per sequence at the end of its context
(speculative verification), causal attention aligned to the end of the KV
(docs/spec.md 8): SDPA through torch's lower-right causal bias (or a boolean
mask where a backend takes no bias), FlexAttention through a mask_mod;
compared with metrale_bench --q-len N rows ("... qN").

Peers (select with --peers, default all):

  sdpa-cudnn, sdpa-flash, sdpa-efficient
      PyTorch's scaled_dot_product_attention (GQA through enable_gqa) on
      CONTIGUOUS bf16 KV -- the fastest contiguous peer on an H200
      (shared/research/peers-h200.md); it reads no block table.
  flex-paged
      FlexAttention (torch.compile(flex_attention), GQA through enable_gqa)
      on a PAGED bf16 cache built with torch's experimental PagedAttention
      helper: pages of --page-size tokens (metrale_bench's default 16) in
      shuffled physical order, as metrale_bench's block tables are. Compiled
      once per shape; the compile time (first call, Triton autotuning
      included) is printed apart from the kernel time.

Every peer runs on the same q and KV data; its output is compared with an
fp32 reference (max over (sequence, q head) of ||out - ref|| / ||ref||, the
metric of metrale's accuracy report). A peer that raises or whose error
exceeds MAX_REL_ERR is reported as such, with the reason, and is left out of
the "best peer" line; it never stops the script.

Prints time, GB/s and, when given metrale_bench's CSV from the same run, the
metrale / peer time ratio per shape. Timing: CUDA-graph replay of launches
cycling through KV replicas that together exceed the L2 (as metrale_bench
does), median of 15 replays. Bytes: K and V of the attended range.

    python3 bench/peers.py --metrale-csv out/bench.csv --csv out/peers.csv
    python3 bench/peers.py --peers sdpa          # skip FlexAttention

FlashInfer is not run (see FLASHINFER_NOTE).
"""
import argparse
import csv
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROTATION_BYTES = 512 << 20

# bf16 output rounding alone gives ~3e-3; a wrong page mapping or mask gives
# errors of order 1 (attention over other sequences' tokens).
MAX_REL_ERR = 2e-2

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
}
PEERS = [*SDPA_BACKENDS, "flex-paged"]

FLASHINFER_NOTE = (
    "# flashinfer: not run -- not installed on the device machine, and its wheels "
    "JIT-compile their CUDA kernels on first use (minutes per kernel variant, with "
    "no internet there to fetch prebuilt ones); see shared/research/peers-h200.md "
    "for numbers from another run"
)

CSV_FIELDS = ["shape", "peer", "us", "gbps", "metrale_over_peer", "max_rel_err", "compile_s", "note"]


def time_us(fn, calls):
    """Median microseconds per call of fn(i), i = 0..calls-1, graph-replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):  # warm-up outside the graph (autotuning, plans)
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i)
    for _ in range(3):
        g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def select_peers(spec, known=None):
    """--peers: 'all', or a comma list of peer names or prefixes ('sdpa', 'flex') of
    `known` (this script's PEERS unless given), in their order."""
    known = list(PEERS if known is None else known)
    if spec.strip() == "all":
        return known
    chosen = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        hits = [p for p in known if p.startswith(item)]
        if not hits:
            raise SystemExit(f"--peers: unknown peer '{item}' (known: {', '.join(known)}, all)")
        chosen += [p for p in hits if p not in chosen]
    return [p for p in known if p in chosen]


def end_causal_mask(n, ctx, device):
    """(n, ctx) bool: query row j (at position ctx - n + j) attends positions <= its own."""
    return torch.arange(ctx, device=device)[None, :] <= (ctx - n + torch.arange(n, device=device))[:, None]


def reference(q, k, v):
    """fp32 attention of q (B, Hq, N, D), rows at the end of contiguous k, v (B, Hkv, T, D), causal."""
    b, hq, n, d = q.shape
    hkv, ctx = k.shape[1], k.shape[2]
    out = torch.empty(b, hq, n, d, dtype=torch.float32, device=q.device)
    mask = end_causal_mask(n, ctx, q.device)
    for s in range(b):  # one sequence at a time bounds the fp32 copies of K and V
        qs = q[s].float().view(hkv, hq // hkv * n, d)  # rows (q head of the group, token)
        logits = torch.matmul(qs, k[s].float().transpose(1, 2)) / math.sqrt(d)
        logits = logits.view(hkv, hq // hkv, n, ctx).masked_fill(~mask, float("-inf"))
        p = torch.softmax(logits, dim=-1).view(hkv, hq // hkv * n, ctx)
        out[s] = torch.matmul(p, v[s].float()).view(hq, n, d)
    return out


def max_rel_err(out, ref):
    """max over (sequence, q head) of ||out - ref|| / ||ref||."""
    out = out.float().reshape(ref.shape)
    num = torch.linalg.vector_norm(out - ref, dim=-1)
    den = torch.linalg.vector_norm(ref, dim=-1)
    return torch.where(den > 0, num / den.clamp_min(1e-30), num).max().item()


_flex_compiled = {}


def compiled_flex(autotune):
    """torch.compile(flex_attention), one wrapper for the whole run.

    dynamic=False: with automatic dynamic shapes the second shape would be
    compiled with a symbolic batch, and Inductor's flex decoding kernel
    (split-KV, GQA heads packed on M) requires a static batch and head
    count -- it would silently fall back to the prefill kernel.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if autotune not in _flex_compiled:
        # One recompile per shape (new block mask sizes and mask closure);
        # the default limit of 8 would leave later shapes running eagerly.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        mode = "max-autotune-no-cudagraphs" if autotune else None
        _flex_compiled[autotune] = torch.compile(flex_attention, dynamic=False, mode=mode)
    return _flex_compiled[autotune]


class FlexPaged:
    """The contiguous KV replicas copied into paged caches, and their block mask.

    Layout is FlexAttention's paged layout: one cache (1, Hkv, pages * page,
    D) per replica, shared by all sequences; the block mask lists, per
    sequence, the physical pages of its context, one page per KV block (so
    the KV block size of the kernel is the page size). Every replica uses the
    same page table, so one block mask serves them all.
    """

    Q_BLOCK = 128  # flex decoding packs the GQA group on M (BLOCK_M 16); Q block must be a multiple

    def __init__(self, ks, vs, page_size, q_len=1, seed=1234):
        from torch.nn.attention.experimental._paged_attention import PagedAttention
        from torch.nn.attention.flex_attention import BlockMask

        b, hkv, ctx, d = ks[0].shape
        dev = ks[0].device
        pages_per_seq = -(-ctx // page_size)
        n_pages = b * pages_per_seq
        pa = PagedAttention(n_pages, page_size, b, device=dev)
        # The helper hands out free pages from the end of its free list, in
        # order; a shuffled free list gives each sequence scattered pages,
        # as metrale_bench's block tables over shuffled pages do.
        pa.empty_pages = torch.randperm(n_pages, generator=torch.Generator().manual_seed(seed)).tolist()
        ctx_t = torch.tensor(ctx, device=dev)
        for s in range(b):
            pa.reserve(torch.tensor(s, device=dev), ctx_t)

        # Logical block mask: complete pages as FULL blocks (the kernel skips
        # mask_mod on them), the last page as a partial block when the context
        # ends inside it. create_block_mask would instead mark every block
        # partial here: it pads q_len 1 up to the q block with masked rows.
        # q_len > 1: the causal mask aligned to the end of the context, its
        # blocks from create_block_mask (pages the last rows only see are partial).
        if q_len > 1:
            from torch.nn.attention.flex_attention import create_block_mask

            def end_causal(b_, h_, q_idx, kv_idx):
                return kv_idx <= q_idx + (ctx - q_len)

            logical = create_block_mask(end_causal, b, None, q_len, ctx, device=dev,
                                        BLOCK_SIZE=(self.Q_BLOCK, page_size))
        else:
            full = ctx // page_size
            tail = pages_per_seq - full  # 0 or 1
            i32 = dict(dtype=torch.int32, device=dev)
            order = torch.arange(pages_per_seq, **i32)
            logical = BlockMask.from_kv_blocks(
                kv_num_blocks=torch.full((b, 1, 1), tail, **i32),
                kv_indices=order.roll(tail).expand(b, 1, 1, pages_per_seq).contiguous(),  # tail page first
                full_kv_num_blocks=torch.full((b, 1, 1), full, **i32),
                full_kv_indices=order.expand(b, 1, 1, pages_per_seq).contiguous(),
                BLOCK_SIZE=(self.Q_BLOCK, page_size),
                seq_lengths=(1, ctx),
            )
        # The helper maps logical to physical pages, and wraps the mask_mod so
        # that it maps a physical position back and masks positions >= kv_len.
        kv_len = torch.full((b,), ctx, dtype=torch.int64, device=dev)
        self.block_mask = pa.convert_logical_block_mask(logical, kv_len=kv_len)

        batch_idx = torch.arange(b, device=dev)
        input_pos = torch.arange(ctx, device=dev).expand(b, ctx)
        self.k_caches, self.v_caches = [], []
        for k, v in zip(ks, vs):
            # zeros, not empty: the kernel multiplies masked tail rows of V by 0
            kc = torch.zeros(1, hkv, n_pages * page_size, d, dtype=k.dtype, device=dev)
            vc = torch.zeros_like(kc)
            pa.assign(batch_idx, input_pos, k, v, kc, vc)
            self.k_caches.append(kc)
            self.v_caches.append(vc)
        self.paged = pa

    def __call__(self, flex, q, i):
        r = i % len(self.k_caches)
        return flex(q, self.k_caches[r], self.v_caches[r], block_mask=self.block_mask, enable_gqa=True)


def short(e):
    lines = [l for l in str(e).splitlines() if l.strip()]
    return f"{type(e).__name__}: {lines[0][:140] if lines else ''}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1024,1x32768,16x8192,64x4096,128x2048,256x1024,32x32768")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16, help="flex-paged page (= KV block) size; metrale_bench --block-size")
    ap.add_argument("--peers", default="all", help=f"comma list of {', '.join(PEERS)} or prefixes (sdpa, flex); default all")
    ap.add_argument("--flex-autotune", action="store_true",
                    help="compile Flex with mode=max-autotune-no-cudagraphs (tries more kernel configs; longer compile)")
    ap.add_argument("--q-len", type=int, default=1,
                    help="query tokens per sequence at the end of its context (causal; metrale_bench --q-len)")
    ap.add_argument("--metrale-csv", help="metrale_bench --csv output of the same run")
    ap.add_argument("--csv", help="write peer rows here")
    args = ap.parse_args()
    hq, hkv = (int(x) for x in args.heads.split("/"))
    d = args.head_dim
    peers = select_peers(args.peers)

    ours = {}
    if args.metrale_csv:
        with open(args.metrale_csv) as f:
            for row in csv.DictReader(f):
                ours[row["shape"]] = float(row["us"])

    rows = []
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  peers {','.join(peers)}")
    print(FLASHINFER_NOTE)
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        kv_bytes = 2 * b * hkv * ctx * d * 2
        reps = max(1, min(64, math.ceil(ROTATION_BYTES / kv_bytes)))
        calls = max(reps, 8)
        n = args.q_len
        name = f"bf16 {b}x{ctx} {hq}/{hkv} d{d}" + (f" q{n}" if n > 1 else "")
        try:
            q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.bfloat16)
            ks = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16) for _ in range(reps)]
            vs = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16) for _ in range(reps)]
            ref = reference(q, ks[0], vs[0])  # replica 0 is the one every peer's output is checked on
        except Exception as e:
            print(f"{name:<28} {'(all peers)':<15} FAILED to set up: {short(e)}")
            q = ks = vs = ref = None
            torch.cuda.empty_cache()
            continue
        best = None

        def report(peer, us=None, err=None, compile_s=None, note=""):
            nonlocal best
            row = {"shape": name, "peer": peer, "us": us, "gbps": None, "metrale_over_peer": None,
                   "max_rel_err": err, "compile_s": compile_s, "note": note}
            extra = f"  compile {compile_s:5.1f} s" if compile_s is not None else ""
            if us is None:  # no time taken: note says why ("unavailable: ...", "FAILED: ...")
                print(f"{name:<28} {peer:<15} {note}{extra}")
            else:
                row["gbps"] = kv_bytes / (us * 1e3)
                row["metrale_over_peer"] = ours.get(name, float("nan")) / us
                ok = err <= MAX_REL_ERR  # False for nan: an unchecked output counts as wrong
                if not ok:
                    row["note"] = note = f"WRONG: max rel err {err:.2e} > {MAX_REL_ERR:.0e}" + (f" ({note})" if note else "")
                print(f"{name:<28} {peer:<15} {us:9.1f} us {row['gbps']:7.0f} GB/s   "
                      f"metrale/peer time {row['metrale_over_peer']:5.2f}   err {err:.1e}{extra}"
                      + (f"   {note}" if note else ""))
                if ok:
                    best = us if best is None else min(best, us)
            rows.append(row)

        for peer in peers:
            if peer in SDPA_BACKENDS:
                backend = SDPA_BACKENDS[peer]

                # q_len > 1: torch's lower-right causal bias, else a boolean mask.
                masks = [None]
                if n > 1:
                    from torch.nn.attention.bias import causal_lower_right
                    masks = [causal_lower_right(n, ctx), end_causal_mask(n, ctx, q.device)]
                failures = []
                for mask in masks:
                    def call(i, backend=backend, mask=mask):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, ks[i % reps], vs[i % reps], attn_mask=mask,
                                                                  enable_gqa=True)

                    try:
                        err = max_rel_err(call(0), ref)
                        us = time_us(call, calls)
                    except Exception as e:  # backend not available for this shape (expected: no GQA path, ...)
                        failures.append(str(e).splitlines()[0][:80] if str(e) else type(e).__name__)
                        continue
                    how = "" if mask is None else ("lower-right bias" if len(failures) == 0 else "bool mask")
                    report(peer, us, err, note=how)
                    break
                else:
                    report(peer, note="unavailable: " + " / ".join(failures))
            elif peer == "flex-paged":
                fp = None
                compile_s = None
                try:
                    flex = compiled_flex(args.flex_autotune)
                    fp = FlexPaged(ks, vs, args.page_size, n)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = fp(flex, q, 0)  # compiles (and autotunes) for this shape
                    torch.cuda.synchronize()
                    compile_s = time.perf_counter() - t0
                    err = max_rel_err(out, ref)
                    us = time_us(lambda i: fp(flex, q, i), calls)
                    report(peer, us, err, compile_s)
                except Exception as e:  # a failing peer is a result, not a crash
                    report(peer, compile_s=compile_s, note=f"FAILED: {short(e)}")
                    traceback.print_exc(file=sys.stderr)
                del fp
        if best is not None and name in ours:
            print(f"{name:<28} {'best peer':<15} {best:9.1f} us   metrale {ours[name]:.1f} us  ratio {ours[name] / best:5.2f}")
        del ks, vs, ref
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
