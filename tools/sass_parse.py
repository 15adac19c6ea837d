"""The reading of `cuobjdump -sass` output that tools/sass_diff.py and
tools/sass_loops.py share: its functions and their instructions, and an
instruction's opcode."""
import re

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def functions(lines):
    """[(mangled name, [(address, instruction text)])] in the listing's order."""
    out, cur = [], None
    for raw in lines:
        if "Function :" in raw:
            cur = (raw.split("Function :", 1)[1].strip(), [])
            out.append(cur)
            continue
        if cur is None:
            continue
        m = LINE.search(raw)
        if m:
            cur[1].append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(text):
    """An instruction's opcode with its modifiers, without its predicate (HMMA.16816.F32, ...)."""
    t = re.sub(r"^@!?U?P\w+\s+", "", text).split()
    return t[0] if t else ""
