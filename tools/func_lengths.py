#!/usr/bin/env python3
"""Lengths of the functions in C++/CUDA sources, longest first: a check of
the "no function of hundreds of lines" rule.

    tools/func_lengths.py src/kernels [--over 120]

A function is a brace block opened on a line that ends a declaration
(a ')' or 'const' before the '{'), outside another function; lambdas count
with their enclosing function.
"""
import argparse
import os
import re
import sys

HEAD = re.compile(r"\)\s*(const)?\s*(noexcept)?\s*(->\s*[\w:<>, ]+)?\s*\{\s*(//.*)?$")


def functions(path):
    lines = open(path, errors="replace").read().split("\n")
    out, depth, start, name = [], 0, None, ""
    for i, line in enumerate(lines):
        code = re.sub(r"//.*", "", line)
        if start is None and HEAD.search(line) and not re.match(r"\s*(if|for|while|switch|else)\b", code.strip()):
            j = i
            while j > 0 and "(" not in lines[j]:
                j -= 1
            start, name, depth = j, lines[j].strip()[:80], 0
        if start is not None:
            depth += code.count("{") - code.count("}")
            if depth <= 0 and "}" in code:
                out.append((i - start + 1, path, start + 1, name))
                start = None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--over", type=int, default=0, help="only functions longer than this")
    args = ap.parse_args()
    found = []
    for p in args.paths:
        files = [p] if os.path.isfile(p) else [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs]
        for f in files:
            if f.endswith((".cu", ".cuh", ".cpp", ".hpp", ".h")):
                found += functions(f)
    for n, f, line, name in sorted(found, reverse=True):
        if n > args.over:
            print(f"{n:5d}  {f}:{line}  {name}")
    sys.exit(0)


if __name__ == "__main__":
    main()
