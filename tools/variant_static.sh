#!/usr/bin/env bash
# The static check of prefill variants (bench/variants/*.patch) before they
# cost device time: for main and each patch applied to it, every prefill
# instantiation's stack and spills (ptxas -v), and the instruction
# counts of one instantiation's tile loop (LOOP_FN, default bf16 head_dim
# 128) beside main's
# (tools/sass_loops.py). Needs cuobjdump and nvdisasm on PATH (PyPI:
# nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm). Restores the tree.
#
#   tools/variant_static.sh bench/variants/NAME.patch ...   (LOOP_FN=Fp8FormatELi128 ...)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v cuobjdump >/dev/null && command -v nvdisasm >/dev/null || { echo "cuobjdump/nvdisasm not on PATH" >&2; exit 1; }
work=$(mktemp -d)
applied=""
trap '[ -z "$applied" ] || git apply -R "$applied"; rm -rf "$work"' EXIT
fn=${LOOP_FN:-Bf16FormatELi128}
case $fn in *Fp8*) loop_fmt=fp8 ;; *Nvfp4*) loop_fmt=nvfp4 ;; *) loop_fmt=bf16 ;; esac
compile() {  # NAME: cubins and ptxas reports of the three formats into $work/NAME.*
  for f in bf16 fp8 nvfp4; do
    nvcc -I include -I src -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -Xptxas=-v,-warn-spills -std=c++17 -cubin -o "$work/$1.$f.cubin" "src/kernels/prefill/prefill_$f.cu" \
      >"$work/$1.$f.ptxas" 2>&1 || { cat "$work/$1.$f.ptxas"; return 1; }
    cuobjdump -sass "$work/$1.$f.cubin" >"$work/$1.$f.sass"
  done
}
report() {  # NAME: stack frame and spills per instantiation
  for f in bf16 fp8 nvfp4; do
    python3 - "$work/$1.$f.ptxas" "$f" <<'PY'
import re, sys
name = None
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '.*Format(ELi\d+)", line)
    if m:
        name = m.group(1).replace("ELi", "d")
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and name:
        print(f"  {sys.argv[2]:<6} {name:<5} stack {m.group(1)}, spill stores {m.group(2)}, loads {m.group(3)}")
PY
  done
}
compile main
echo "== main"
report main
for v in "$@"; do
  name=$(basename "$v" .patch)
  git apply "$v"
  applied=$v
  if compile "$name"; then
    echo "== $name"
    report "$name"
    python3 tools/sass_loops.py "$work/main.$loop_fmt.sass" --function "$fn" --with HGMMA --compare "$work/$name.$loop_fmt.sass" |
      grep -E '^loop 0:'
  fi
  git apply -R "$v"
  applied=""
done
