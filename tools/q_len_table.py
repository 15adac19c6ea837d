#!/usr/bin/env python3
"""The multi-token table of one device run (tools/device_run.sh QLEN_BENCH=1).

Reads OUT/qlen_N.csv (metrale_bench --q-len N, the planner's plan),
OUT/qlen_N_t1.csv (the same with --col-tiles 1) and OUT/qlen_peers_N.csv
(bench/peers.py --q-len N) and prints, per format and shape, for each q_len:
time, GB/s (the KV bytes of the attended range, read once), fraction of the
read ceiling R measured in the same run, the ratio to the same shape's q_len 1
time (targets: q2 1.08, q4 1.15, q8 1.3, q16 1.5), the one-column-tile time, and the
best peer on a bf16 cache (the peers have no FP8 or NVFP4 paged cache)
with metrale's time over it, for every format.

    python3 tools/q_len_table.py OUT
"""
import csv
import os
import re
import sys

TARGET = {1: 1.0, 2: 1.08, 4: 1.15, 8: 1.3, 16: 1.5}


def rows(path):
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return {r["shape"]: r for r in csv.DictReader(f)}


def base_shape(shape):
    """'fp8 16x8192 32/8 d128 q4' -> ('fp8', '16x8192 32/8 d128', 4)."""
    m = re.match(r"(\S+) (.*?)(?: q(\d+))?$", shape)
    return m.group(1), m.group(2), int(m.group(3) or 1)


def main(out):
    runs = {}
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"qlen_(\d+)(_t1)?\.csv", name)
        if m:
            runs[(int(m.group(1)), bool(m.group(2)))] = rows(os.path.join(out, name))
    peers = {n: {} for n in TARGET}
    for n in TARGET:
        path = os.path.join(out, f"qlen_peers_{n}.csv")
        if os.path.exists(path):
            with open(path) as f:
                for r in csv.DictReader(f):
                    ok = r["us"] and not r["note"].startswith("WRONG")
                    if ok:
                        key = base_shape(r["shape"])[1]
                        best = peers[n].get(key)
                        if best is None or float(r["us"]) < best[0]:
                            peers[n][key] = (float(r["us"]), r["peer"])
    q1 = {}
    for shape, r in runs.get((1, False), {}).items():
        q1[shape] = float(r["us"])
    ceiling = next((float(r["ceiling_gbps"]) for t in runs.values() for r in t.values()), float("nan"))
    print(f"R (read ceiling, same run) = {ceiling:.0f} GB/s\n")
    print("| format | shape | q_len | µs | GB/s | R | ratio to q1 (target) | 1 col tile µs | best peer µs (which) | metrale / peer |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (n, t1), table in sorted(runs.items()):
        if t1:
            continue
        for shape, r in table.items():
            fmt, base, _ = base_shape(shape)
            us = float(r["us"])
            ref = q1.get(f"{fmt} {base}")
            ratio = f"{us / ref:.2f} ({TARGET[n]:.2f})" if ref else "-"
            one = runs.get((n, True), {}).get(shape)
            one_us = f"{float(one['us']):.1f}" if one else "-"
            peer = peers.get(n, {}).get(base)
            peer_s = f"{peer[0]:.1f} ({peer[1]})" if peer else "-"
            over = f"{us / peer[0]:.2f}" if peer else "-"
            print(f"| {fmt} | {base} | {n} | {us:.1f} | {float(r['gbps']):.0f} | {float(r['fraction_of_ceiling']):.3f} "
                  f"| {ratio} | {one_us} | {peer_s} | {over} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
