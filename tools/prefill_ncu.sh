#!/usr/bin/env bash
# ncu of one prefill kernel (the first paged_prefill_kernel a prefill_bench
# run launches): throughput, warp stalls, instruction mix, per-instruction
# samples. Clocks are left alone (--clock-control none, device METHOD.md).
#
#   tools/prefill_ncu.sh PREFILL_BENCH DIR [prefill_bench options]
#   (default options: --formats bf16 --shapes 8192)
# Writes DIR/NAME.txt (the details page), DIR/NAME_sass.csv.gz (per SASS
# instruction: executions and stall samples by reason, for
# tools/ncu_sass_stalls.py) and DIR/NAME.log; returns ncu's status.
# NCU_KERNEL (default paged_prefill_kernel) picks another kernel of the run
# (tools/runs_ncu.sh: the runs kernel), NCU_NAME (default prefill_ncu) the files' name.
set -uo pipefail
bench=$1 dir=$2
shift 2
[ $# -gt 0 ] || set -- --formats bf16 --shapes 8192
ncu=/usr/local/cuda/bin/ncu
name=${NCU_NAME:-prefill_ncu}
"$ncu" --clock-control none --graph-profiling node -k "regex:${NCU_KERNEL:-paged_prefill_kernel}" -c 1 \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy --section LaunchStats \
  --section SourceCounters -f -o "$dir/$name" "$bench" "$@" >"$dir/$name.log" 2>&1
rc=$?
"$ncu" -i "$dir/$name.ncu-rep" --page details >"$dir/$name.txt" 2>&1
"$ncu" -i "$dir/$name.ncu-rep" --page source --csv --print-source sass >"$dir/${name}_sass.csv" 2>&1
gzip -f "$dir/${name}_sass.csv"
rm -f "$dir/$name.ncu-rep"
exit "$rc"
