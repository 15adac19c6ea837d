#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from the CSV that
`ncu -i REPORT --page source --csv --print-source sass` writes
(tools/device_run.sh PREFILL_NCU=1 leaves it as prefill_ncu_sass.csv.gz).

    python3 tools/ncu_sass_stalls.py out/prefill_ncu_sass.csv.gz [--top 25]

Prints the stall reasons' shares of all samples, the instructions with the
most samples (with the barrier a wait loop polls: mbarrier try-waits are
reported on the branch after them), and the samples of each role when the
kernel changes its register budget (setmaxnreg: USETMAXREG splits the
consumers' code from the producer's)."""
import argparse
import csv
import gzip
import re
from collections import Counter


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    # A first line naming the kernel, then the header.
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr = rows[head]
    return {h: i for i, h in enumerate(hdr)}, [r for r in rows[head + 1:] if len(r) == len(hdr)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    idx, data = read(a.csv)
    stalls = [h for h in idx if h.startswith("stall_") and "Not Issued" not in h]
    src = [r[idx["Source"]].strip() for r in data]
    samples = [int(r[idx["# Samples"]] or 0) for r in data]
    execs = [int(r[idx["Instructions Executed"]] or 0) for r in data]
    total = max(sum(samples), 1)
    print(f"{len(data)} instructions, {total} samples")
    by_reason = Counter({h[6:]: sum(int(r[idx[h]] or 0) for r in data) for h in stalls})
    print("stall reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(8)))
    splits = [i for i, x in enumerate(src) if "USETMAXREG" in x]
    if splits:
        bounds = [0] + splits + [len(data)]
        print("by region (split at USETMAXREG): " + ", ".join(
            f"[{bounds[k]}, {bounds[k + 1]}) {100 * sum(samples[bounds[k]:bounds[k + 1]]) / total:.1f}%"
            for k in range(len(bounds) - 1)))
    print(f"\n{'index':>6} {'share':>6} {'executed':>10}  instruction  [top reasons]")
    for i in sorted(range(len(data)), key=lambda i: -samples[i])[:a.top]:
        reasons = sorted(((int(data[i][idx[h]] or 0), h[6:]) for h in stalls), reverse=True)[:2]
        polled = ""
        if "BRA" in src[i]:
            for j in range(i - 1, max(i - 4, -1), -1):
                m = re.search(r"SYNCS\.PHASECHK\S*\s+\S+\s+(\[[^\]]+\])", src[j])
                if m:
                    polled = f"  (waits on {m.group(1)})"
                    break
        print(f"{i:>6} {100 * samples[i] / total:5.1f}% {execs[i]:>10}  {src[i][:60]}  "
              f"{[(n, v) for v, n in reasons if v]}{polled}")


if __name__ == "__main__":
    main()
