#!/usr/bin/env bash
# ncu of one prefill kernel (the first paged_prefill_kernel a prefill_bench
# run launches): throughput, warp stalls, instruction mix, per-instruction
# samples. Clocks are left alone (--clock-control none, device METHOD.md).
#
#   tools/prefill_ncu.sh PREFILL_BENCH DIR [prefill_bench options]
#   (default options: --formats bf16 --shapes 8192)
# Writes DIR/prefill_ncu.txt (the details page), DIR/prefill_ncu_sass.csv.gz
# (per SASS instruction: executions and stall samples by reason, for
# tools/ncu_sass_stalls.py) and DIR/prefill_ncu.log; returns ncu's status.
set -uo pipefail
bench=$1 dir=$2
shift 2
[ $# -gt 0 ] || set -- --formats bf16 --shapes 8192
ncu=/usr/local/cuda/bin/ncu
"$ncu" --clock-control none --graph-profiling node -k regex:paged_prefill_kernel -c 1 --section SpeedOfLight \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters -f -o "$dir/prefill_ncu" \
  "$bench" "$@" >"$dir/prefill_ncu.log" 2>&1
rc=$?
"$ncu" -i "$dir/prefill_ncu.ncu-rep" --page details >"$dir/prefill_ncu.txt" 2>&1
"$ncu" -i "$dir/prefill_ncu.ncu-rep" --page source --csv --print-source sass >"$dir/prefill_ncu_sass.csv" 2>&1
gzip -f "$dir/prefill_ncu_sass.csv"
rm -f "$dir/prefill_ncu.ncu-rep"
exit "$rc"
