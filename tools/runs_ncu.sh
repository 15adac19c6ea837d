#!/usr/bin/env bash
# ncu of the runs kernel (the decode kernel with query runs: the first
# paged_decode_kernel a `prefill_bench --prefill off` run launches) at
# several verification shapes, for the cost of its column tiles (session
# 17: NVFP4 q_len 2 / 4 / 8 at 1 x 32768). Clocks are left alone.
#
#   OUT=dir tools/runs_ncu.sh PREFILL_BENCH[.xz] [FORMAT [SHAPE ...]]
#   (defaults: nvfp4, 1x2+32766 1x4+32764 1x8+32760; head_dim 128)
# Writes $OUT/runs_ncu.tgz: per shape the details page (r_SHAPE.txt), the
# per-instruction CSV (r_SHAPE.csv.gz) and tools/ncu_sass_stalls.py's
# summary (r_SHAPE.stalls).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
bench=$1 fmt=${2:-nvfp4}
shift $(($# >= 2 ? 2 : 1))
[ $# -gt 0 ] || set -- 1x2+32766 1x4+32764 1x8+32760
case $bench in *.xz) tools/unxz.sh "$bench" /tmp/runs_ncu_bench && bench=/tmp/runs_ncu_bench ;; esac
ncu=/usr/local/cuda/bin/ncu
work=$(mktemp -d)
for s in "$@"; do
  "$ncu" --clock-control none -k regex:paged_decode_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats --section Occupancy \
    --section LaunchStats --section SourceCounters -f -o "$work/r_$s" \
    "$bench" --formats "$fmt" --head-dim 128 --prefill off --shapes "$s" >"$work/r_$s.log" 2>&1
  "$ncu" -i "$work/r_$s.ncu-rep" --page details >"$work/r_$s.txt" 2>&1
  "$ncu" -i "$work/r_$s.ncu-rep" --page source --csv --print-source sass >"$work/r_$s.csv" 2>&1
  python3 tools/ncu_sass_stalls.py "$work/r_$s.csv" --top 12 >"$work/r_$s.stalls" 2>&1
  gzip -f "$work/r_$s.csv"
  rm -f "$work/r_$s.ncu-rep"
done
mkdir -p "$OUT" && tar czf "$OUT/runs_ncu.tgz" -C "$work" . && rm -rf "$work"
