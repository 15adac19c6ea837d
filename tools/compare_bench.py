"""Before/after table of tools/bench_ab.sh's CSVs (and prefill_bench logs):
per (op, shape) the best time of each binary over the rounds, their ratio,
and the read ceilings."""
import csv
import glob
import os
import re
import sys


def best(paths):
    rows, ceilings = {}, []
    for p in paths:
        for r in csv.DictReader(open(p)):
            key = (r["op"], r["shape"])
            us = float(r["us"])
            rows[key] = min(rows.get(key, us), us)
            ceilings.append(float(r["ceiling_gbps"]))
    return rows, ceilings


out = sys.argv[1]
worst = 0.0
for op in ("decode", "write"):
    a, ca = best(sorted(glob.glob(os.path.join(out, f"{op}_A_*.csv"))))
    b, cb = best(sorted(glob.glob(os.path.join(out, f"{op}_B_*.csv"))))
    if not ca or not cb:
        continue  # not run (bench_ab.sh BENCH_AB_WRITE=0) or failed: its logs say
    print(f"## {op}: R (A) {min(ca):.0f}-{max(ca):.0f} GB/s, R (B) {min(cb):.0f}-{max(cb):.0f} GB/s")
    print(f"{'shape':<40} {'A us':>9} {'B us':>9} {'B/A':>7}")
    for key in a:
        if key in b:
            ratio = b[key] / a[key]
            worst = max(worst, abs(ratio - 1))
            print(f"{key[1]:<40} {a[key]:9.1f} {b[key]:9.1f} {ratio:7.3f}")
# prefill_bench rows: "<format> <shape> <us> us <TFLOPS> TFLOPS ...".
prefill = {}
for path in glob.glob(os.path.join(out, "prefill_[AB]_*.log")):
    side = os.path.basename(path).split("_")[1]
    for line in open(path):
        m = re.match(r"(\S+)\s+(\S+)\s+([\d.]+) us", line)
        if m:
            key = (m[1], m[2])
            prefill.setdefault(key, {})
            prefill[key][side] = min(prefill[key].get(side, float("inf")), float(m[3]))
if prefill:
    print("## prefill")
    print(f"{'format shape':<40} {'A us':>9} {'B us':>9} {'B/A':>7}")
    for key, t in sorted(prefill.items()):
        if "A" in t and "B" in t:
            ratio = t["B"] / t["A"]
            worst = max(worst, abs(ratio - 1))
            print(f"{key[0] + ' ' + key[1]:<40} {t['A']:9.1f} {t['B']:9.1f} {ratio:7.3f}")
print(f"largest |B/A - 1| = {100 * worst:.1f}%")
