#!/usr/bin/env python3
"""The prefill tables from the log that `tools/device_run.sh
PREFILL_BENCH=1 PREFILL_DIMS="128 64 256"` writes (prefill.log: per head
dim, prefill_bench's rows, then bench/prefill_peers.py's): TFLOPS per format
and peer, and the ratios the targets name.

    python3 tools/prefill_tables.py out/prefill.log > prefill_tables.md
"""
import re
import sys

FORMATS = ("bf16", "fp8", "nvfp4")
PEERS = ("sdpa-cudnn", "sdpa-flash", "flex")


def parse(path):
    """{head_dim: {"shapes": [...], "tflops": {(name, shape): TFLOPS}}}"""
    dims, dim = {}, None
    for line in open(path):
        m = re.search(r"32/8 heads d(\d+)", line)
        if line.startswith("#") and m:
            dim = dims.setdefault(int(m.group(1)), {"shapes": [], "tflops": {}})
            continue
        f = line.split()
        if dim is None or len(f) < 4 or line.startswith("#"):
            continue
        if f[0] in FORMATS and f[3] == "us":  # fmt shape us "us" TFLOPS "TFLOPS" ...
            name, shape, tflops = f[0], f[1], float(f[4])
        elif f[1] in PEERS:  # shape peer us TFLOPS fraction ...
            name, shape, tflops = f[1], f[0], float(f[3])
        else:
            continue
        if shape not in dim["shapes"]:
            dim["shapes"].append(shape)
        dim["tflops"][(name, shape)] = tflops
    return dims


def table(dim):
    t = dim["tflops"]
    cols = ["bf16", "fp8", "NVFP4", "cuDNN", "flash", "Flex", "bf16 / cuDNN", "bf16 / best peer", "fp8 / bf16",
            "NVFP4 / bf16"]
    out = ["| shape | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]
    for s in dim["shapes"]:
        get = lambda n: t.get((n, s))
        vals = [get(n) for n in FORMATS + PEERS]
        bf16, fp8, nvfp4, cudnn = vals[0], vals[1], vals[2], vals[3]
        peers = [v for v in vals[3:] if v]
        ratio = lambda a, b: f"{a / b:.2f}" if a and b else "-"
        cells = [f"{v:.0f}" if v else "-" for v in vals]
        cells += [ratio(bf16, cudnn), ratio(bf16, max(peers) if peers else None), ratio(fp8, bf16),
                  ratio(nvfp4, bf16)]
        out.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    dims = parse(sys.argv[1])
    for d in sorted(dims, key=lambda d: (d != 128, d)):
        print(f"## head_dim {d}\n\n{table(dims[d])}\n")


if __name__ == "__main__":
    main()
