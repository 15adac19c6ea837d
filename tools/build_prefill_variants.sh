#!/usr/bin/env bash
# Builds prefill_bench, metrale_bench (decode and the runs kernel at the
# q_len table's shapes), test_gpu_attn and test_gpu_decode for main (the
# tree as committed)
# and for each variant patch (bench/variants/*.patch, applied to it) in the
# build tree `build/` (incremental: git apply, and apply -R after it, give
# the patched files new times, so ninja recompiles what they reach),
# strips them and stores them xz-compressed (about 1.7 MB each, against
# 14 MB) in .deps/ab/<name>/, for tools/prefill_ab.sh on the GPU machine
# (carry ".deps/ab"). A knockout (a name starting with ko-: timing only,
# wrong results) gets no test binary. Leaves the tree as it found it.
#
#   tools/build_prefill_variants.sh main bench/variants/NAME.patch ...
# Variants are patches, not branches: only what is on main reaches the
# next session (session 14's 18 branches did not).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -z "$(git status --porcelain --untracked-files=no -- src include)" ] || { echo "src/ or include/ has changes: commit or stash first" >&2; exit 1; }
applied=""
trap '[ -z "$applied" ] || git apply -R "$applied"' EXIT
for v in "$@"; do
  if [ "$v" = main ]; then
    name=main
  else
    name=$(basename "$v" .patch)
    git apply "$v"
    applied=$v
  fi
  bins=(build/bench/prefill_bench)
  case $name in ko-*) ;; *) bins+=(build/bench/metrale_bench build/tests/test_gpu_attn build/tests/test_gpu_decode) ;; esac
  ninja -C build "${bins[@]#build/}" >/dev/null
  dir=".deps/ab/$(echo "$name" | tr -c 'A-Za-z0-9_\n' '_')"  # a shell name: PREFILL_AB_ARGS_<name>
  rm -rf "$dir" && mkdir -p "$dir"
  for bin in "${bins[@]}"; do
    strip -o "$dir/$(basename "$bin")" "$bin"
    xz -9 -f "$dir/$(basename "$bin")"
  done
  { git rev-parse HEAD; [ "$v" = main ] || sha256sum "$v"; } >"$dir/source"
  if [ -n "$applied" ]; then git apply -R "$applied"; applied=""; fi
  echo "$v -> $dir/"
done
du -sh .deps/ab
