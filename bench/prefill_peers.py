#!/usr/bin/env python3
"""Peer PREFILL attention (query runs) on an H200: time, TFLOPS, fraction of peak.

The prefill counterpart of bench/peers.py (decode): the peers metrale's
prefill kernel is compared with on the same shapes. Causal attention of query runs,
--heads q/kv heads (GQA, default 32/8), --head-dim (default 128; a comma list
such as 64,128,256 runs each), bf16. Shapes (--shapes, comma list):

  N           one prompt of N tokens, no cached prefix: q_len = kv_len = N,
              lower-triangular causal mask.
  N+P         a chunk of N new tokens over a cached prefix of P tokens:
              kv_len = N + P, query j sits at position P + j and attends
              positions [0, P + j] (causal aligned to the END: lower-right).
  raggedK     a ragged batch of K prompts of 512, 1024, ..., 512*K tokens,
              each its own causal prompt (ragged8: 512 .. 4096).

Peers (--peers, comma list of names or prefixes, default all):

  sdpa-cudnn, sdpa-flash
      torch.nn.functional.scaled_dot_product_attention under
      sdpa_kernel(CUDNN_ATTENTION / FLASH_ATTENTION) on contiguous
      (B, H, S, D) bf16 tensors, enable_gqa=True (kv heads repeated, outside
      the timed region, where the backend has no GQA path: the note says
      so). Prompts: is_causal=True. Chunks: torch's lower-right causal bias
      (torch.nn.attention.bias.causal_lower_right), as bench/peers.py does
      for q_len > 1 -- but only where that bias reaches the peer's own fused
      kernel. Under sdpa_kernel(CUDNN_ATTENTION) the bias cannot: torch
      sends a lower-right bias to the flash or efficient kernel only, and
      otherwise materializes a boolean mask on every call; the cuDNN peer
      is then given the same boolean (N, N+P) mask, built once outside the
      timed region (note "bool mask": cuDNN applies it as an arbitrary mask).
  flex
      FlexAttention: torch.compile(flex_attention) (bench/peers.py's
      compiled_flex: dynamic=False, one compile per shape) with a block mask
      from create_block_mask of the same end-aligned causal mask_mod, built
      outside the timed region; contiguous KV (no paged variant here). The
      compile time (first call, autotuning included) goes into the note.

raggedK: every peer makes K separate calls, one per prompt, inside the timed
function (no padding, no varlen kernel); the time is their sum.

Accuracy: each shape's output is compared with a float32 reference computed
once per shape by SDPA's math backend (kv heads repeated, boolean end-causal
mask): max over (sequence, q head, row) of ||out - ref|| / ||ref|| (bench/
peers.py's max_rel_err). A run with more than FULL_CHECK_TOKENS kv positions
is checked on its last CHECK_ROWS query rows only (reference computed on
those rows against the whole KV; the note says so). Errors above
MAX_REL_ERR mark the row WRONG.

FLOPs (the count metrale's benchmark uses): for every query row j of every
sequence, attended(j) = number of kv positions it attends (P + j + 1);
FLOPs = 4 * head_dim * num_q_heads * sum_j attended(j) -- the two matmuls
of the attended positions, nothing for masked-out work a kernel may do.

Timing: as bench/peers.py, CUDA-graph replay (warm-up first, on a side
stream), here `calls` launches of the timed function per graph so that one
replay lasts about a millisecond, median of --reps (default 25) replays.
Where graph capture fails, the same launches are timed eagerly with CUDA
events (note "eager-timed"). Inputs are random normal bf16 (scale 1), drawn
anew in every invocation (seed from the clock unless --seed; printed), and
every launch of a shape reads the same tensors (prefill is compute-bound; the
L2 is not rotated as in bench/peers.py's decode timing).

    python3 bench/prefill_peers.py --csv out/prefill_peers.csv
    python3 bench/prefill_peers.py --head-dim 64,128,256 --peers sdpa

Output: a header line (device, torch, peers, heads, head dims, the peak the
fractions are of, seed), then one line per (head dim, shape, peer): shape,
peer, us, TFLOPS, fraction of peak, max rel err, note. --csv PATH writes the
same rows (peer,shape,us,tflops,fraction_of_peak,max_rel_err,note), row by
row; `shape` is the --shapes item, bench/prefill_bench's shape key (with
" dD" appended when --head-dim lists several). A peer not timed has empty
us/tflops/... and says why in its note ("unavailable: ..." where the backend
has no kernel for the shape, "FAILED: ..." for any other exception).
Any exception for one (peer, shape) is such a row; the script goes on.
"""
import argparse
import csv
import math
import os
import statistics
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from peers import MAX_REL_ERR, compiled_flex, end_causal_mask, max_rel_err, select_peers, short  # noqa: E402

# H100 / H200 SXM dense BF16 tensor-core peak (no sparsity), TFLOP/s.
DEFAULT_PEAK_TFLOPS = 989.4
DEFAULT_SHAPES = "1024,4096,8192,16384,2048+30720,ragged8"
RAGGED_STEP = 512
FULL_CHECK_TOKENS = 4096  # runs with more kv positions are checked on their last rows only
CHECK_ROWS = 256
SAMPLE_US = 1000.0  # a timed sample (graph replay) lasts about this long
MAX_CALLS = 64

SDPA_BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
}
PEERS = [*SDPA_BACKENDS, "flex"]

CSV_FIELDS = ["peer", "shape", "us", "tflops", "fraction_of_peak", "max_rel_err", "note"]

# SDPA explains every backend it did not pick in a UserWarning per call; the
# exception (or the note) already says what matters.
for _pattern in ("kernel not used because", "has been runtime disabled", "fused kernels require",
                 "Flash attention requires", "Memory efficient kernel", "cuDNN", "Expected query, key"):
    warnings.filterwarnings("ignore", message=f".*{_pattern}", category=UserWarning)


def parse_shape(s):
    """'N' -> [(N, 0)]; 'N+P' -> [(N, P)]; 'raggedK' -> [(512, 0), (1024, 0), ..., (512*K, 0)].

    Each pair is one sequence's (new tokens, cached prefix)."""
    s = s.strip()
    try:
        if s.startswith("ragged"):
            k = int(s[len("ragged"):])
            if k < 1:
                raise ValueError
            return [(RAGGED_STEP * (i + 1), 0) for i in range(k)]
        if "+" in s:
            n, p = (int(x) for x in s.split("+"))
        else:
            n, p = int(s), 0
    except ValueError:
        raise ValueError(f"shape '{s}': expected N, N+P or raggedK (K >= 1)") from None
    if n < 1 or p < 0:
        raise ValueError(f"shape '{s}': need N >= 1 new tokens and a prefix P >= 0")
    return [(n, p)]


def prefill_flops(shape_runs, num_q_heads, head_dim):
    """4 * head_dim * num_q_heads * sum over rows j of attended(j) = P + j + 1."""
    attended = sum(n * p + n * (n + 1) // 2 for n, p in shape_runs)
    return 4 * head_dim * num_q_heads * attended


def time_calls(calls, args, device):
    """time_us of one pass over `calls` (a shape's sequences, one call each)."""
    def fn():
        for c in calls:
            c()

    return time_us(fn, args.reps, args.warmup, device)


def _sample(run, calls, device):
    """Microseconds per call of one run() (which makes `calls` calls)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6 / calls
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def time_us(fn, reps, warmup, device):
    """(median microseconds per fn(), how it was timed).

    As bench/peers.py's time_us: warm-up on a side stream, then a CUDA graph
    of `calls` launches of fn, replayed; median over reps replays. Falls back
    to eager launches timed by CUDA events where capture fails."""
    if device.type != "cuda":  # the CPU dry run: wall clock
        for _ in range(warmup):
            fn()
        return statistics.median(_sample(fn, 1, device) for _ in range(reps)), "cpu wall clock"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):  # autotuning, plans, lazy init: outside the graph
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    est = min(_sample(fn, 1, device) for _ in range(3))
    calls = max(1, min(MAX_CALLS, math.ceil(SAMPLE_US / max(est, 1e-3))))

    def eager():
        for _ in range(calls):
            fn()

    how = f"graph x{calls}"
    run = eager
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            eager()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        run = g.replay
    except Exception as e:  # not capturable: time the same launches eagerly
        how = f"eager-timed x{calls} (graph capture failed: {short(e)[:100]})"
        g = None
        torch.cuda.synchronize()  # raises if the failed capture left an error behind
        eager()
    times = [_sample(run, calls, device) for _ in range(reps)]
    del g
    return statistics.median(times), how


class Shape:
    """One shape's inputs (one (q, k, v) per sequence) and its fp32 reference rows."""

    def __init__(self, spec, hq, hkv, d, device, gen):
        self.runs = parse_shape(spec)
        self.spec = spec
        self.hq, self.hkv, self.d = hq, hkv, d
        self.flops = prefill_flops(self.runs, hq, d)
        self.seqs = []
        for n, p in self.runs:
            def randn(*shape):
                return torch.randn(*shape, generator=gen, device=device, dtype=torch.bfloat16)

            q = randn(1, hq, n, d)
            k = randn(1, hkv, n + p, d)
            v = randn(1, hkv, n + p, d)
            self.seqs.append((q, k, v, n, p))
        # Reference: last `rows` query rows of each sequence (all of them for short runs).
        self.check_rows = []
        self.refs = []
        for q, k, v, n, p in self.seqs:
            rows = n if n + p <= FULL_CHECK_TOKENS else min(n, CHECK_ROWS)
            self.check_rows.append(rows)
            self.refs.append(self.reference(q, k, v, rows))
        self.partial_check = any(r < n for r, (n, _) in zip(self.check_rows, self.runs))

    def reference(self, q, k, v, rows):
        """fp32 SDPA (math backend) of the last `rows` query rows, end-aligned causal mask."""
        n, ctx = q.shape[2], k.shape[2]
        g = self.hq // self.hkv
        qf = q[:, :, n - rows:].float()
        kf = k.float().repeat_interleave(g, dim=1)  # q head h reads kv head h // g, as enable_gqa
        vf = v.float().repeat_interleave(g, dim=1)
        mask = end_causal_mask(rows, ctx, q.device)
        with sdpa_kernel(SDPBackend.MATH):
            out = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
        del kf, vf
        return out

    def error(self, outs):
        """max rel err of a peer's outputs (one per sequence) on the reference rows."""
        return max(max_rel_err(o[:, :, o.shape[2] - rows:], ref)
                   for o, rows, ref in zip(outs, self.check_rows, self.refs))

    def check_note(self):
        parts = []
        if len(self.runs) > 1:
            parts.append(f"{len(self.runs)} separate calls, no padding, time summed")
        if self.partial_check:
            parts.append(f"err on last {CHECK_ROWS} q rows (kv > {FULL_CHECK_TOKENS})")
        return "; ".join(parts)


def lower_right_route(backend, q, k, v):
    """Which kernel torch's lower-right CausalBias reaches under sdpa_kernel(backend):
    'flash' or 'efficient' (CausalBias calls those kernels directly where they
    are enabled and take the shape), 'materialized' (it builds a boolean mask
    on every call and calls SDPA with it), or 'unknown' (the check failed)."""
    try:
        from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

        with sdpa_kernel(backend):
            params = SDPAParams(q, k, v, None, 0.0, False, True)
            if can_use_flash_attention(params):
                return "flash"
            if can_use_efficient_attention(params):
                return "efficient"
        return "materialized"
    except Exception:
        return "unknown"


def sdpa_options(peer, seq, hq, hkv):
    """Ways to run one sequence with SDPA under the peer's backend, best first:
    [(label, call)], call() -> (1, Hq, N, D) output. Masks and repeated kv
    heads are built here, outside the timed region."""
    backend = SDPA_BACKENDS[peer]
    q, k, v, n, p = seq
    ctx = n + p
    masks = []  # (label, sdpa keyword arguments)
    if p == 0:
        masks.append(("is_causal", dict(is_causal=True)))
    else:
        from torch.nn.attention.bias import causal_lower_right

        route = lower_right_route(backend, q, k, v)
        if route != "materialized":  # the peer's own kernel takes the lower-right mask
            masks.append((f"lower-right bias ({route} kernel)", dict(attn_mask=causal_lower_right(n, ctx))))
        bool_mask = end_causal_mask(n, ctx, q.device)
        masks.append(("bool mask", dict(attn_mask=bool_mask)))
        additive = torch.zeros(n, ctx, dtype=q.dtype, device=q.device).masked_fill_(~bool_mask, float("-inf"))
        masks.append(("additive bf16 mask", dict(attn_mask=additive)))
    kv_variants = [("", lambda: (k, v), dict(enable_gqa=True))]
    if hq != hkv:
        g = hq // hkv
        kv_variants.append(("kv heads repeated",
                            lambda: (k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)), {}))
    options = []
    for gqa_label, get_kv, gqa_kw in kv_variants:
        for mask_label, mask_kw in masks:
            def make(get_kv=get_kv, kw={**mask_kw, **gqa_kw}):
                kk, vv = get_kv()

                def call():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, kk, vv, **kw)
                return call

            options.append((", ".join(x for x in (mask_label, gqa_label) if x), make))
    return options


def group_failures(failures):
    """[(label, reason)] -> 'a, b: reason1 / c: reason2' (labels with the same reason together)."""
    by_reason = {}
    for label, reason in failures:
        by_reason.setdefault(reason, []).append(label)
    return " / ".join(f"{'; '.join(labels)}: {reason}" for reason, labels in by_reason.items())


def run_sdpa(peer, shape, args, device):
    """(us, err, note) of an SDPA peer; raises 'unavailable: ...' with every attempt's reason."""
    # Each sequence takes the first option that runs (a ragged shape: the same for all, in practice).
    calls, outs, labels = [], [], []
    for seq in shape.seqs:
        failures = []
        for label, make in sdpa_options(peer, seq, shape.hq, shape.hkv):
            try:
                call = make()
                outs.append(call())
            except Exception as e:  # this backend has no kernel for it: try the next way
                failures.append((label, short(e)[:100]))
                continue
            calls.append(call)
            labels.append(label + (f" (refused: {group_failures(failures)})" if failures else ""))
            break
        else:
            raise RuntimeError("unavailable: " + group_failures(failures))
    err = shape.error(outs)
    del outs

    us, how = time_calls(calls, args, device)
    return us, err, "; ".join(dict.fromkeys([*labels, *([how] if how.startswith("eager") else [])]))


def run_flex(shape, args, device):
    from torch.nn.attention.flex_attention import create_block_mask

    flex = compiled_flex(args.flex_autotune)
    masks = []
    for _, _, _, n, p in shape.seqs:
        def end_causal(b, h, q_idx, kv_idx, p=p):
            return kv_idx <= q_idx + p

        masks.append(create_block_mask(end_causal, None, None, n, n + p, device=device))
    calls = []
    compile_s = 0.0
    outs = []
    for (q, k, v, _, _), bm in zip(shape.seqs, masks):
        def call(q=q, k=k, v=v, bm=bm):
            return flex(q, k, v, block_mask=bm, enable_gqa=True)

        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs.append(call())  # compiles (and autotunes) for this sequence's sizes
        if device.type == "cuda":
            torch.cuda.synchronize()
        compile_s += time.perf_counter() - t0
        calls.append(call)
    err = shape.error(outs)
    del outs

    us, how = time_calls(calls, args, device)
    note = f"compile {compile_s:.1f} s" + (f"; {how}" if how.startswith("eager") else "")
    return us, err, note


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help=f"comma list of N, N+P, raggedK (default {DEFAULT_SHAPES})")
    ap.add_argument("--heads", default="32/8", help="q heads / kv heads (default 32/8)")
    ap.add_argument("--head-dim", default="128", help="head dim, or a comma list (64,128,256); default 128")
    ap.add_argument("--peers", default="all", help=f"comma list of {', '.join(PEERS)} or prefixes (sdpa); default all")
    ap.add_argument("--peak-tflops", type=float, default=DEFAULT_PEAK_TFLOPS,
                    help=f"dense BF16 peak for fraction_of_peak (default {DEFAULT_PEAK_TFLOPS}: H100/H200 SXM)")
    ap.add_argument("--reps", type=int, default=25, help="timed graph replays; the median is reported (default 25)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls before capture (default 5)")
    ap.add_argument("--seed", type=int, help="input seed (default: from the clock; printed)")
    ap.add_argument("--flex-autotune", action="store_true",
                    help="compile Flex with mode=max-autotune-no-cudagraphs (more kernel configs; longer compile)")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu runs the logic only (tiny shapes)")
    ap.add_argument("--csv", help="write rows here (peer,shape,us,tflops,fraction_of_peak,max_rel_err,note)")
    args = ap.parse_args()
    try:
        hq, hkv = (int(x) for x in args.heads.split("/"))
        head_dims = [int(x) for x in args.head_dim.split(",") if x.strip()]
    except ValueError:
        ap.error("--heads is Q/KV (e.g. 32/8), --head-dim an integer or a comma list")
    if hkv < 1 or hq % hkv:
        ap.error(f"--heads {args.heads}: q heads must be a multiple of kv heads")
    if args.reps < 1 or args.warmup < 0:
        ap.error("--reps >= 1 (20 or more for the reported median), --warmup >= 0")
    specs = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in specs:
        try:
            parse_shape(s)
        except ValueError as e:
            ap.error(str(e))
    peers = select_peers(args.peers, PEERS)
    device = torch.device(args.device)
    seed = args.seed if args.seed is not None else time.time_ns() % (1 << 31)

    dev_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    print(f"# {dev_name}  torch {torch.__version__}  peers {','.join(peers)}  bf16 {hq}/{hkv} heads "
          f"d{','.join(map(str, head_dims))}  "
          f"peak {args.peak_tflops:g} TFLOPS (dense BF16)  seed {seed}  median of {args.reps}")
    print(f"# {'shape':<16} {'peer':<11} {'us':>10} {'TFLOPS':>8} {'of peak':>7} {'max err':>8}  note")

    rows = []
    csv_file = writer = None
    if args.csv:  # written row by row: a later crash keeps the rows already measured
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        csv_file = open(args.csv, "w", newline="")
        writer = csv.DictWriter(csv_file, fieldnames=CSV_FIELDS)
        writer.writeheader()

    def report(name, peer, us=None, flops=None, err=None, note=""):
        row = {"peer": peer, "shape": name, "us": us, "tflops": None, "fraction_of_peak": None,
               "max_rel_err": err, "note": note}
        if us is None:  # not timed: the note says why
            print(f"{name:<18} {peer:<11} {'-':>10} {'-':>8} {'-':>7} {'-':>8}  {note}")
        else:
            row["tflops"] = flops / (us * 1e-6) / 1e12
            row["fraction_of_peak"] = row["tflops"] / args.peak_tflops
            if not err <= MAX_REL_ERR:  # also nan
                row["note"] = note = f"WRONG: max rel err {err:.2e} > {MAX_REL_ERR:.0e}" + (f"; {note}" if note else "")
            print(f"{name:<18} {peer:<11} {us:10.1f} {row['tflops']:8.1f} {row['fraction_of_peak']:7.3f} "
                  f"{err:8.1e}  {note}")
        rows.append(row)
        sys.stdout.flush()
        if writer:
            writer.writerow(row)
            csv_file.flush()

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    for d in head_dims:
        for spec in specs:
            # The shape key of bench/prefill_bench's rows (one head dim per file); with
            # several head dims in one run, the head dim is appended to keep rows apart.
            name = spec if len(head_dims) == 1 else f"{spec} d{d}"
            try:
                shape = Shape(spec, hq, hkv, d, device, gen)
            except Exception as e:
                for peer in peers:
                    report(name, peer, note=f"FAILED to set up: {short(e)}")
                traceback.print_exc(file=sys.stderr)
                shape = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            base_note = shape.check_note()
            for peer in peers:
                try:
                    if peer in SDPA_BACKENDS:
                        us, err, note = run_sdpa(peer, shape, args, device)
                    else:
                        us, err, note = run_flex(shape, args, device)
                    report(name, peer, us, shape.flops, err, "; ".join(x for x in (note, base_note) if x))
                except Exception as e:  # a failing peer is a result, not a crash
                    msg = str(e) if str(e).startswith("unavailable: ") else f"FAILED: {short(e)}"
                    report(name, peer, note=msg)
                    if not msg.startswith("unavailable"):
                        traceback.print_exc(file=sys.stderr)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            del shape
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if csv_file:
        csv_file.close()


if __name__ == "__main__":
    main()
