#!/usr/bin/env bash
# Builds prefill_bench at each named branch (or commit) in the build tree
# `build/` (incremental: the kernels that differ recompile), strips it and
# copies it to .deps/ab/<name>/prefill_bench, for tools/prefill_ab.sh on the
# GPU machine (carry ".deps/ab"; about 14 MB per binary, 64 MB in all).
# Returns to the branch it started on.
#
#   tools/build_prefill_variants.sh BRANCH [BRANCH ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash first" >&2; exit 1; }
start=$(git rev-parse --abbrev-ref HEAD)
trap 'git checkout -q "$start"' EXIT
for b in "$@"; do
  git checkout -q "$b"
  touch src/kernels/prefill/*.cu  # ninja's timestamps after a checkout
  ninja -C build bench/prefill_bench >/dev/null
  name=$(echo "$b" | tr '/' '_')
  mkdir -p ".deps/ab/$name"
  strip -o ".deps/ab/$name/prefill_bench" build/bench/prefill_bench
  echo "$b ($(git rev-parse --short HEAD)) -> .deps/ab/$name/prefill_bench"
done
du -sh .deps/ab
