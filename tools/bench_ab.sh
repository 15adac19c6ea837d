#!/usr/bin/env bash
# Before/after timing of two metrale_bench binaries in one run on one GPU:
# decode and cache write at the benchmark's default shapes (or BENCH_ARGS),
# ROUNDS rounds (default 2) alternating A and B so that clock and thermal
# drift fall on both; then tools/compare_bench.py prints, per row, the best
# time of each binary over the rounds and B / A. BENCH_AB_PREFILL=1 adds the
# prefill_bench beside each metrale_bench (PREFILL_ARGS, e.g. "--shapes
# 4096,8192,16384" or "--head-dim 256").
#
#   tools/bench_ab.sh A_BENCH B_BENCH OUT_DIR     (BENCH_AB_WRITE=0: no cache write)
set -uo pipefail
A=$1 B=$2 OUT=$3
mkdir -p "$OUT"
for r in $(seq 1 "${ROUNDS:-2}"); do
  for side in A B; do
    bin=$A; [ $side = B ] && bin=$B
    "$bin" ${BENCH_ARGS:-} --csv "$OUT/decode_${side}_$r.csv" >"$OUT/decode_${side}_$r.log" 2>&1
    [ "${BENCH_AB_WRITE:-1}" = 1 ] &&
      "$bin" ${BENCH_ARGS:-} --op write --csv "$OUT/write_${side}_$r.csv" >"$OUT/write_${side}_$r.log" 2>&1
    [ "${BENCH_AB_PREFILL:-0}" = 1 ] &&
      "$(dirname "$bin")/prefill_bench" ${PREFILL_ARGS:-} >"$OUT/prefill_${side}_$r.log" 2>&1
  done
done
python3 "$(dirname "$0")/compare_bench.py" "$OUT" | tee "$OUT/ab.txt"
