#!/usr/bin/env python3
"""Charts of metrale results (optional tooling; needs matplotlib, not run in CI).

  tools/plot_results.py --bench-csv bench/results/2026-11-30-v4/bench.csv \
                        --serve-json serve.json --out-dir plots/

--bench-csv: a CSV of metrale_bench (columns op, shape,
  splits, us, gbps, fraction_of_ceiling, ceiling_gbps, max_rel_err, note;
  shape like "fp8 64x4096 32/8 d128") -> bench_gbps.png: decode GB/s against
  context length per format (batched and single-sequence shapes as separate
  lines), with the measured read ceiling as a dotted line.
--serve-json: the --json of `metrale serve-sim` -> serve_sim.png: sequences
  served per format in the same KV budget (peak, mean, mean while full) and
  the decode steps the request stream took.
Either input may be given alone.
"""
import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

FORMAT_COLORS = {"bf16": "tab:blue", "fp8": "tab:orange", "nvfp4": "tab:green"}
# "fp8 64x4096 32/8 d128": format, batch, context, heads, head_dim.
SHAPE_RE = re.compile(r"^(?P<format>\w+) (?P<batch>\d+)x(?P<context>\d+) (?P<heads>\d+/\d+) d(?P<d>\d+)$")


def load_bench(path):
    """Decode rows of a bench CSV as dicts with parsed shape fields."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            m = SHAPE_RE.match(r["shape"].strip())
            if r["op"] != "decode" or not m or not r["gbps"]:
                continue  # cache-write rows and unparsable shapes are not charted
            rows.append({"format": m["format"], "batch": int(m["batch"]), "context": int(m["context"]),
                         "gbps": float(r["gbps"]),
                         "ceiling": float(r["ceiling_gbps"]) if r.get("ceiling_gbps") else None})
    return rows


def plot_bench(rows, out, plt):
    fig, ax = plt.subplots(figsize=(8, 5))
    # One solid line per format through its batched shapes (each point labelled
    # with its batch size) and a dashed one through its single-sequence shapes,
    # which are latency-bound and would hide the trend if mixed in.
    series = defaultdict(list)  # (format, single) -> [(context, gbps, batch)]
    for r in rows:
        series[(r["format"], r["batch"] == 1)].append((r["context"], r["gbps"], r["batch"]))
    for (fmt, single), pts in sorted(series.items()):
        pts.sort()
        ax.plot([c for c, _, _ in pts], [g for _, g, _ in pts], marker="o", linestyle="--" if single else "-",
                color=FORMAT_COLORS.get(fmt), label=f"{fmt}, {'1 sequence' if single else 'batched'}")
        if not single:
            for c, g, b in pts:
                ax.annotate(f"x{b}", (c, g), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for c in sorted({r["ceiling"] for r in rows if r["ceiling"]}):
        ax.axhline(c, color="gray", linestyle=":", linewidth=1)
        ax.text(0.01, c, f"read ceiling {c:.0f} GB/s", transform=ax.get_yaxis_transform(), va="bottom",
                color="gray", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length (tokens per sequence; xN: batch size)")
    ax.set_ylabel("achieved GB/s (K, V and scale bytes / decode time)")
    ax.set_title("metrale decode bandwidth per format")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_serve(doc, out, plt):
    rows = doc["rows"]
    formats = [r["format"] for r in rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.5))
    width = 0.27
    for i, (key, label) in enumerate([("peak_seqs", "peak"), ("mean_seqs", "mean"),
                                      ("saturated_seqs", "mean while the budget is full")]):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ax.bar(xs, [r.get(key, 0) for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), formats)
    ax.set_ylabel("concurrent sequences")
    cfg = doc.get("config", {})
    ax.set_title(f"sequences served in {cfg.get('budget_mib', '?')} MiB of KV")
    ax.legend(fontsize=8)
    ax2.bar(formats, [r["steps"] for r in rows], color=[FORMAT_COLORS.get(f, "gray") for f in formats])
    ax2.set_ylabel("decode steps for the whole request stream")
    ax2.set_title(f"{cfg.get('num_requests', '?')} requests")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench-csv", type=Path, help="metrale_bench CSV")
    ap.add_argument("--serve-json", type=Path, help="`metrale serve-sim --json` output")
    ap.add_argument("--out-dir", type=Path, default=Path("."), help="where the PNGs go (default: .)")
    args = ap.parse_args()
    if not args.bench_csv and not args.serve_json:
        ap.error("give --bench-csv and/or --serve-json")
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_results.py needs matplotlib: pip install matplotlib")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.bench_csv:
        rows = load_bench(args.bench_csv)
        if not rows:
            sys.exit(f"{args.bench_csv}: no decode rows with a parsable shape")
        plot_bench(rows, args.out_dir / "bench_gbps.png", plt)
        print(f"wrote {args.out_dir / 'bench_gbps.png'} ({len(rows)} rows)")
    if args.serve_json:
        with open(args.serve_json) as f:
            plot_serve(json.load(f), args.out_dir / "serve_sim.png", plt)
        print(f"wrote {args.out_dir / 'serve_sim.png'}")


if __name__ == "__main__":
    main()
