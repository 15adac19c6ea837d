"""Before/after table of tools/bench_ab.sh's CSVs: per (op, shape) the best
time of each binary over the rounds, their ratio, and the read ceilings."""
import csv
import glob
import os
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
print(f"largest |B/A - 1| = {100 * worst:.1f}%")
