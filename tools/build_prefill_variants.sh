#!/usr/bin/env bash
# Builds prefill_bench and test_gpu_attn at each named branch (or commit) in
# the build tree `build/` (incremental: what differs recompiles), strips
# them and stores them xz-compressed (about 1.7 MB each, against 14 MB) in
# .deps/ab/<name>/, for tools/prefill_ab.sh on the GPU machine (carry
# ".deps/ab"). Returns to the branch it started on.
#
#   tools/build_prefill_variants.sh BRANCH [BRANCH ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash first" >&2; exit 1; }
start=$(git rev-parse --abbrev-ref HEAD)
trap 'git checkout -q "$start"' EXIT
for b in "$@"; do
  git checkout -q "$b"
  touch src/kernels/prefill/*.cu src/kernels/decode/decode.cu  # ninja's timestamps after a checkout
  ninja -C build bench/prefill_bench tests/test_gpu_attn >/dev/null
  name=$(echo "$b" | tr -c 'A-Za-z0-9_\n' '_')  # a shell name: PREFILL_AB_ARGS_<name>
  mkdir -p ".deps/ab/$name"
  for bin in build/bench/prefill_bench build/tests/test_gpu_attn; do
    strip -o ".deps/ab/$name/$(basename "$bin")" "$bin"
    xz -9 -f ".deps/ab/$name/$(basename "$bin")"
  done
  git rev-parse HEAD >".deps/ab/$name/commit"
  echo "$b ($(git rev-parse --short HEAD)) -> .deps/ab/$name/"
done
du -sh .deps/ab
