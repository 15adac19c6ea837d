#!/usr/bin/env python3
"""A model of the prefill kernel's launch order (bench/RESULTS.md, session 25).

Each cluster (a CTA pair, or a CTA where pairs are off) costs c0 + c1 per
176-position K / V tile of its span (an empty one: `--empty` us); the
hardware hands the next cluster of the launch order to the first free slot
(66 pairs of SMs, or 132 SMs). c0 and c1 are fitted (least squares on log
TFLOPS) to the measured bf16 d128 prompts given with --measured; the model
then prints each shape's TFLOPS, also with the clusters in longest-first
order and with free empty clusters. 32/8 heads, GQA 4, 128 rows per CTA.

  tools/prefill_launch_model.py --measured 1024=269,4096=514,8192=591,16384=593
"""
import argparse
import heapq
import math

N, ROWS, GROUP, HEADS, SMS, L2_BYTES = 176, 128, 4, 8, 132, 50 << 20


def tiles_of(n):
    return (n * GROUP + ROWS - 1) // ROWS


def band_of(lens):  # planner.cpp prefill_tile_band (above L2), rounded to whole pairs
    if 2 * 256 * sum(lens) * HEADS <= L2_BYTES:
        return 0
    ht = max(tiles_of(n) for n in lens)
    b = max(1, min((SMS + len(lens) - 1) // len(lens), (ht + 3) // 4))
    return b + b % 2


def clusters(lens, pairs):
    """Spans in 176-position tiles (None: no rows) in launch order (prefill_item)."""
    pc = 2 if pairs else 1
    ht = max(tiles_of(n) for n in lens)
    ht += ht % pc
    band = band_of(lens)

    def span(s, k):
        hi = lens[s] * GROUP - k * pc * ROWS
        return None if hi <= 0 else math.ceil(((hi - 1) // GROUP + 1) / N)

    if band == 0:  # the 3-D grid: tile major, then sequence, kv unit fastest
        return [span(s, k) for k in range(ht // pc) for s in range(len(lens)) for _ in range(HEADS)]
    per, out = max(band // pc, 1), []
    for b in range(math.ceil(ht // pc / per)):
        for _ in range(HEADS):
            for k in range(b * per, min((b + 1) * per, ht // pc)):
                out += [span(s, k) for s in range(len(lens))]
    return out


def tflops(lens, pairs, c0, c1, empty, order=None):
    costs = clusters(lens, pairs)
    if order == "lpt":
        costs.sort(key=lambda c: -(c or 0))
    slots = [0.0] * (SMS // 2 if pairs else SMS)
    for c in costs:
        t = heapq.heappop(slots)
        heapq.heappush(slots, t + (empty if c is None else c0 + c * c1))
    flops = sum(4 * 128 * 32 * n * (n + 1) / 2 for n in lens)
    return flops / max(slots) / 1e6


def shape(name):
    if name.startswith("ragged"):
        return [512 * i for i in range(1, int(name[6:]) + 1)]
    return [int(name)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", required=True, help="N=TFLOPS,... (prompts; pairs from 2048 tokens)")
    ap.add_argument("--shapes", default="1024,4096,8192,16384,ragged8")
    ap.add_argument("--empty", type=float, default=0.5, help="us an empty cluster holds its slot")
    a = ap.parse_args()
    meas = {k: float(v) for k, v in (x.split("=") for x in a.measured.split(","))}
    pairs_of = lambda lens: max(lens) >= 2048
    best = min(((sum(math.log(tflops(shape(k), pairs_of(shape(k)), c0, c1, a.empty) / v) ** 2
                     for k, v in meas.items()), c0, c1)
                for c0 in [0.5 * i for i in range(30)] for c1 in [2.0 + 0.05 * i for i in range(30)]))
    _, c0, c1 = best
    print(f"fit: c0 {c0} us per cluster, c1 {c1:.2f} us per tile")
    for k in a.shapes.split(","):
        lens, p = shape(k), pairs_of(shape(k))
        print(f"{k:>8}: model {tflops(lens, p, c0, c1, a.empty):5.0f}  longest first "
              f"{tflops(lens, p, c0, c1, a.empty, 'lpt'):5.0f}  empty free {tflops(lens, p, c0, c1, 0.0):5.0f}"
              f"  measured {meas.get(k, float('nan')):5.0f}")


if __name__ == "__main__":
    main()
