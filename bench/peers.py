#!/usr/bin/env python3
"""Peer decode attention on the same shapes as bench/metrale_bench, in the same run.

Runs PyTorch's scaled_dot_product_attention (cuDNN, flash and efficient
backends, GQA through enable_gqa) on contiguous bf16 KV -- the fastest
contiguous peer on an H200 (shared/research/peers-h200.md) -- and prints
time, GB/s and, when given metrale_bench's CSV from the same run, the
metrale / peer time ratio per shape. Timing: CUDA-graph replay of launches
cycling through KV replicas that together exceed the L2 (as metrale_bench
does), median of 15 replays. Bytes: K and V of the attended range.

    python3 bench/peers.py --metrale-csv out/bench.csv --csv out/peers.csv
"""
import argparse
import csv
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROTATION_BYTES = 512 << 20

BACKENDS = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
}


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1x1024,1x32768,16x8192,64x4096,128x2048,256x1024,32x32768")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--metrale-csv", help="metrale_bench --csv output of the same run")
    ap.add_argument("--csv", help="write peer rows here")
    args = ap.parse_args()
    hq, hkv = (int(x) for x in args.heads.split("/"))
    d = args.head_dim

    ours = {}
    if args.metrale_csv:
        with open(args.metrale_csv) as f:
            for row in csv.DictReader(f):
                ours[row["shape"]] = float(row["us"])

    rows = []
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}")
    for shape in args.shapes.split(","):
        b, ctx = (int(x) for x in shape.split("x"))
        kv_bytes = 2 * b * hkv * ctx * d * 2
        reps = max(1, min(64, math.ceil(ROTATION_BYTES / kv_bytes)))
        q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16)
        ks = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16) for _ in range(reps)]
        vs = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16) for _ in range(reps)]
        name = f"bf16 {b}x{ctx} {hq}/{hkv} d{d}"
        best = None
        for peer, backend in BACKENDS.items():
            try:
                def call(i, backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, ks[i % reps], vs[i % reps], enable_gqa=True)
                us = time_us(call, max(reps, 8))
            except Exception as e:  # backend not available for this shape
                print(f"{name:<28} {peer:<15} unavailable: {str(e).splitlines()[0][:80]}")
                continue
            gbps = kv_bytes / (us * 1e3)
            ratio = ours.get(name, float("nan")) / us
            print(f"{name:<28} {peer:<15} {us:9.1f} us {gbps:7.0f} GB/s   metrale/peer time {ratio:5.2f}")
            rows.append({"shape": name, "peer": peer, "us": us, "gbps": gbps, "metrale_over_peer": ratio})
            best = us if best is None else min(best, us)
        if best is not None and name in ours:
            print(f"{name:<28} {'best peer':<15} {best:9.1f} us   metrale {ours[name]:.1f} us  ratio {ours[name] / best:5.2f}")
        del ks, vs
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["shape", "peer", "us", "gbps", "metrale_over_peer"])
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
