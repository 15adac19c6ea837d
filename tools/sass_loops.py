#!/usr/bin/env python3
"""The loops of a kernel's SASS and what they hold: a static check of a
kernel change before it costs device time (instruction counts per loop,
by opcode; a second SASS file gives the difference).

    cuobjdump -sass prefill_bf16.cubin > a.sass   (cuobjdump needs nvdisasm on PATH;
    both install from PyPI: nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)
    tools/sass_loops.py a.sass --function 'Bf16FormatELi128' [--with HGMMA] [--compare b.sass]

A loop is the span from a backward branch's target to the branch.
--common leaves out the conditional paths a steady state skips; with
--elements N (cached elements one lane handles per iteration) it prints
instructions per element. With
--with OPCODE only the loops holding that opcode are shown (HGMMA: the
prefill kernel's tile loops), innermost first; --top N opcodes per loop.
"""
import argparse
import collections
import re
import sys

import sass_parse

BRANCH = re.compile(r"\bBRA\b(?:\.\S+)?\s+(?:\w+,\s*)?0x([0-9a-f]+)")


def functions(path):
    """{mangled name: [(address, instruction text)]} of a cuobjdump -sass file."""
    with open(path) as f:
        return dict(sass_parse.functions(f))


def family(text):
    """An instruction's opcode without its predicate and modifiers (HGMMA, MUFU, ...)."""
    return sass_parse.opcode(text).split(".")[0]


def loops(insts):
    """[(start address, end address)] of the backward branches, innermost first."""
    found = []
    for addr, text in insts:
        m = BRANCH.search(text)
        if m:
            target = int(m.group(1), 16)
            if target <= addr:
                found.append((target, addr))
    return sorted(set(found), key=lambda se: se[1] - se[0])


FORWARD = re.compile(r"^@!?U?P\w+\s+BRA(?:\.\S+)?\s+(?:\w+,\s*)?0x([0-9a-f]+)")


def rare_addresses(insts, span, keep=("HMMA", "HGMMA", "LDG")):
    """Addresses inside span that only a taken conditional forward branch
    skips and that hold none of the `keep` families: the paths a steady
    state leaves out (a rescale of the accumulators, masks at a range's
    edges), while the guarded stages and loads stay counted."""
    s, e = span
    inside = [(a, t) for a, t in insts if s <= a <= e]
    rare = set()
    for a, t in inside:
        m = FORWARD.search(t)
        if not m:
            continue
        target = int(m.group(1), 16)
        if a < target <= e:
            region = [(b, u) for b, u in inside if a < b < target]
            if not {family(u) for _, u in region} & set(keep):
                rare.update(b for b, _ in region)
    return rare


def histogram(insts, span, common=False):
    """Instructions per opcode family inside span (common: without rare_addresses)."""
    s, e = span
    skip = rare_addresses(insts, span) if common else set()
    return collections.Counter(family(t) for a, t in insts if s <= a <= e and a not in skip)


def pick(funcs, pattern):
    names = [n for n in funcs if re.search(pattern, n)]
    if len(names) != 1:
        sys.exit(f"--function {pattern!r} matches {len(names)} functions: {names or list(funcs)}")
    return funcs[names[0]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sass")
    ap.add_argument("--function", required=True, help="a regex matching one function's mangled name")
    ap.add_argument("--with", dest="with_op", default="", help="only loops holding this opcode family")
    ap.add_argument("--compare", help="a second SASS file: the difference per opcode family, loop by loop")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--common", action="store_true",
                    help="leave out the branches a steady state skips (rare_addresses)")
    ap.add_argument("--elements", type=int, default=0,
                    help="cached elements one lane handles per loop iteration: prints instructions per element")
    a = ap.parse_args()
    found = []
    for path in [a.sass] + ([a.compare] if a.compare else []):
        insts = pick(functions(path), a.function)
        spans = [(sp, histogram(insts, sp, a.common)) for sp in loops(insts)]
        sel = [(sp, h) for sp, h in spans if not a.with_op or h[a.with_op]]
        found.append([h for _, h in sel])
        print(f"{path}: {len(insts)} instructions, {len(sel)} loops{' with ' + a.with_op if a.with_op else ''}")
        for sp, h in sel:
            top = ", ".join(f"{op} {n}" for op, n in h.most_common(a.top))
            print(f"  loop {sp[0]:#06x}-{sp[1]:#06x}: {sum(h.values())} instructions: {top}")
            if a.elements:
                per = ", ".join(f"{op} {n / a.elements:.2f}" for op, n in h.most_common(a.top))
                print(f"    per element: {sum(h.values()) / a.elements:.2f} ({per})")
    if a.compare:
        for i, (fa, fb) in enumerate(zip(found[0], found[1])):
            diff = {op: fb[op] - fa[op] for op in set(fa) | set(fb) if fb[op] != fa[op]}
            print(f"loop {i}: {sum(fa.values())} -> {sum(fb.values())}: " +
                  ", ".join(f"{op} {d:+d}" for op, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))))


if __name__ == "__main__":
    main()
