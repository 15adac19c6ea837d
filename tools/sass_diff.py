#!/usr/bin/env python3
"""Compare the SASS of two builds, kernel by kernel: a check that a change of
source (a split into files, a rename) left the generated code as it was.

    tools/sass_diff.py BASE NEW [--objects decode_bf16 prefill_fp8 ...]
                                [--show N] [--ignore-const]

BASE and NEW are object files, fatbins or cubins, or two build folders (their
*.cu.o files are paired by path relative to the folder). Each side's SASS
comes from `cuobjdump -sass`, registers and stack from `cuobjdump -res-usage`
(cuobjdump and nvdisasm must be on PATH; both install from PyPI:
nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).

Functions are paired by mangled name first; what is left (a renamed template
or parameter type) by signature (the demangled name without its parameters,
enum flags read as bools), then by identical code, then in order within the
same base name (the identifier before its template arguments) and finally in
order overall. For each pair it prints one line: identical, identical but for the
kernel-parameter offsets (c[0x0][...], with --ignore-const), the same
instructions but for register numbers, branch targets and parameter offsets
(regs-only: a different register allocation), or the
instruction count before -> after and the opcodes whose counts differ; and
the registers and stack bytes where they changed. The exit status is 0 when
every pair is identical (or identical but for constant offsets with
--ignore-const), 1 otherwise.
"""
import argparse
import collections
import os
import re
import subprocess
import sys

import sass_parse
from sass_parse import opcode

CONST = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")
REGS = re.compile(r"\b(U?R|U?P|B)(\d+|Z|T)\b")
TARGET = re.compile(r"\b0x[0-9a-f]+\b")
RES = re.compile(r"Function (\S+):\s*(.*)")


def cuobjdump(args):
    try:
        return subprocess.run(["cuobjdump"] + args, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("sass_diff: cuobjdump not on PATH (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    except subprocess.CalledProcessError as e:
        if "does not contain device code" in e.stderr or "no SASS" in e.stderr.lower():
            return ""
        sys.exit(f"sass_diff: cuobjdump {' '.join(args)} failed:\n{e.stderr}")


def functions(path):
    """[(mangled name, [instruction text])] in cuobjdump's order."""
    return [(name, [re.sub(r"\s+", " ", t) for _, t in insts])
            for name, insts in sass_parse.functions(cuobjdump(["-sass", path]).splitlines())]


def resources(path):
    """{mangled name: {'REG': n, 'STACK': n, ...}}."""
    res = {}
    for raw in cuobjdump(["-res-usage", path]).splitlines():
        m = RES.search(raw)
        if m:
            res[m.group(1)] = dict((k, int(v)) for k, v in re.findall(r"(\w+):(\d+)", m.group(2)))
    return res


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
        return dict(zip(names, out))
    except FileNotFoundError:
        return {n: n for n in names}


def base_name(demangled):
    """The function's identifier without its namespace, template arguments or parameters."""
    head = demangled.split("<", 1)[0].split("(", 1)[0]
    return head.split("::")[-1].split()[-1] if head.strip() else demangled


def signature(demangled):
    """A demangled name without its parameter list, with enum template flags
    written as the bools they replace ((ns::Flag)1 -> true), so that a
    kernel whose bool flags became named enums keeps its signature."""
    s = re.sub(r"\((?:[\w:]+)\)([01])\b", lambda m: "true" if m.group(1) == "1" else "false", demangled)
    depth = 0
    for i in range(len(s) - 1, -1, -1):  # drop the outermost trailing (...)
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                return s[:i]
    return s


def pair_functions(a, b):
    """[(name_a, name_b)]: by name, then by signature(), then identical code,
    then order within base name, then order."""
    names_b = {n for n, _ in b}
    pairs = [(n, n) for n, _ in a if n in names_b]
    done_a = {x for x, _ in pairs}
    done_b = {y for _, y in pairs}
    dm_all = demangle([n for n, _ in a if n not in done_a] + [n for n, _ in b if n not in done_b])
    by_sig = collections.defaultdict(list)
    for n, _ in b:
        if n not in done_b:
            by_sig[signature(dm_all[n])].append(n)
    for n, _ in a:
        if n in done_a:
            continue
        same = by_sig.get(signature(dm_all[n]))
        if same:
            m = same.pop(0)
            pairs.append((n, m))
            done_a.add(n)
            done_b.add(m)
    left_a = [(n, i) for n, i in a if n not in done_a]
    left_b = [(n, i) for n, i in b if n not in done_b]
    by_code = collections.defaultdict(list)
    for n, i in left_b:
        by_code["\n".join(i)].append(n)
    rest_a = []
    for n, i in left_a:
        same = by_code.get("\n".join(i))
        if same:
            m = same.pop(0)
            pairs.append((n, m))
            done_b.add(m)
        else:
            rest_a.append(n)
    rest_b = [n for n, _ in left_b if n not in done_b]
    dm = demangle(rest_a + rest_b)
    groups = collections.defaultdict(list)
    for n in rest_b:
        groups[base_name(dm[n])].append(n)
    unpaired_a = []
    for n in rest_a:
        g = groups.get(base_name(dm[n]))
        if g:
            pairs.append((n, g.pop(0)))
        else:
            unpaired_a.append(n)
    unpaired_b = [n for g in groups.values() for n in g]
    while unpaired_a and unpaired_b:
        pairs.append((unpaired_a.pop(0), unpaired_b.pop(0)))
    return pairs, unpaired_a, unpaired_b


def short(name, width=150):
    d = demangle([name])[name]
    return d if len(d) <= width else d[: width - 3] + "..."


def compare(path_a, path_b, args):
    fa, fb = functions(path_a), functions(path_b)
    ra, rb = resources(path_a), resources(path_b)
    ia, ib = dict(fa), dict(fb)
    pairs, only_a, only_b = pair_functions(fa, fb)
    order = {n: k for k, (n, _) in enumerate(fa)}
    pairs.sort(key=lambda p: order[p[0]])
    stats = collections.Counter()
    print(f"== {path_a}\n-> {path_b}: {len(fa)} -> {len(fb)} functions")
    for na, nb in pairs:
        xa, xb = ia[na], ib[nb]
        resa, resb = ra.get(na, {}), rb.get(nb, {})
        res = ""
        for k in ("REG", "STACK", "LOCAL"):
            if resa.get(k) != resb.get(k):
                res += f" {k} {resa.get(k)}->{resb.get(k)}"
        label = short(na) + ("" if na == nb else f"\n      as {short(nb)}")
        if xa == xb:
            stats["identical"] += 1
            if args.verbose or res:
                print(f"  identical  {len(xa):6d}  {label}{res}")
            continue
        ca = [CONST.sub("c[0x0][P]", x) for x in xa]
        cb = [CONST.sub("c[0x0][P]", x) for x in xb]
        if ca == cb:
            stats["const-only"] += 1
            print(f"  const-only {len(xa):6d}  {label}{res}")
            continue
        ra_ = [TARGET.sub("0x?", REGS.sub(r"\1?", x)) for x in ca]
        rb_ = [TARGET.sub("0x?", REGS.sub(r"\1?", x)) for x in cb]
        if ra_ == rb_:
            stats["regs-only"] += 1
            print(f"  regs-only  {len(xa):6d}  {label}{res}")
            continue
        stats["differs"] += 1
        ha = collections.Counter(opcode(x) for x in xa)
        hb = collections.Counter(opcode(x) for x in xb)
        diff = sorted((k, hb[k] - ha[k]) for k in set(ha) | set(hb) if hb[k] != ha[k])
        ops = " ".join(f"{k}{d:+d}" for k, d in diff) or "same opcode counts, other order or operands"
        print(f"  DIFFERS    {len(xa):6d} -> {len(xb):6d}  {label}{res}\n      {ops}")
        if args.show:
            shown = 0
            for k, (x, y) in enumerate(zip(ca, cb)):
                if x != y:
                    print(f"      @{k}: {x}\n         {y}")
                    shown += 1
                    if shown >= args.show:
                        break
    for n in only_a:
        stats["only-base"] += 1
        print(f"  ONLY BASE  {len(ia[n]):6d}  {short(n)}")
    for n in only_b:
        stats["only-new"] += 1
        print(f"  ONLY NEW   {len(ib[n]):6d}  {short(n)}")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())))
    return stats


def object_pairs(a, b, only):
    if os.path.isfile(a) and os.path.isfile(b):
        return [(a, b)]
    found = []
    for root, _, files in os.walk(a):
        for f in sorted(files):
            if not f.endswith(".cu.o"):
                continue
            if only and not any(o in f for o in only):
                continue
            rel = os.path.relpath(os.path.join(root, f), a)
            other = os.path.join(b, rel)
            if os.path.exists(other):
                found.append((os.path.join(a, rel), other))
            else:
                print(f"sass_diff: {rel} has no counterpart under {b}", file=sys.stderr)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--objects", nargs="*", help="only object files whose name contains one of these")
    ap.add_argument("--ignore-const", action="store_true", help="count a difference of parameter offsets only as identical")
    ap.add_argument("--show", type=int, default=0, help="print the first N differing instructions of each function")
    ap.add_argument("-v", "--verbose", action="store_true", help="also list the identical functions")
    args = ap.parse_args()
    total = collections.Counter()
    pairs = object_pairs(args.base, args.new, args.objects)
    if not pairs:
        sys.exit("sass_diff: no object files to compare")
    for a, b in pairs:
        total += compare(a, b, args)
    print("total: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())))
    bad = total["differs"] + total["only-base"] + total["only-new"] + (0 if args.ignore_const else total["const-only"])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
