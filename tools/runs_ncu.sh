#!/usr/bin/env bash
# ncu of the runs kernel (the decode kernel with query runs: the first
# paged_decode_kernel a `prefill_bench --prefill off` run launches) at
# several verification shapes, for the cost of its column tiles (session
# 17: NVFP4 q_len 2 / 4 / 8 at 1 x 32768). Clocks are left alone.
#
#   OUT=dir tools/runs_ncu.sh PREFILL_BENCH[.xz] [FORMAT [SHAPE ...]]
#   (defaults: nvfp4, 1x2+32766 1x4+32764 1x8+32760; head_dim 128)
# Writes $OUT/runs_ncu.tgz: per shape tools/prefill_ncu.sh's files (named
# r_SHAPE) and tools/ncu_sass_stalls.py's summary (r_SHAPE.stalls).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
bench=$1 fmt=${2:-nvfp4}
shift $(($# >= 2 ? 2 : 1))
[ $# -gt 0 ] || set -- 1x2+32766 1x4+32764 1x8+32760
case $bench in *.xz) tools/unxz.sh "$bench" /tmp/runs_ncu_bench && bench=/tmp/runs_ncu_bench ;; esac
work=$(mktemp -d)
for s in "$@"; do
  NCU_KERNEL=paged_decode_kernel NCU_NAME="r_$s" tools/prefill_ncu.sh "$bench" "$work" \
    --formats "$fmt" --head-dim 128 --prefill off --shapes "$s"
  python3 tools/ncu_sass_stalls.py "$work/r_${s}_sass.csv.gz" --top 12 >"$work/r_$s.stalls" 2>&1
done
mkdir -p "$OUT" && tar czf "$OUT/runs_ncu.tgz" -C "$work" . && rm -rf "$work"
