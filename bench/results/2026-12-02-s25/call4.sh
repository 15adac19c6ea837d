#!/usr/bin/env bash
# Session 25, call 4: the submitted kernels (.deps/build): the q_len table
# (issue 17) with its peers, one run; pytest; then memcheck / racecheck of
# test_gpu_decode and of test_gpu_attn's query-run (runs kernel) tests.
set -u
TESTS=0 PYTEST=0 BENCH=0 QLEN_BENCH=1 QLEN_T1=0 METRALE_BUILD_DIR=.deps/build tools/device_run.sh >"$OUT/qlen_run.txt" 2>&1
cat "$OUT/qlen_table.md" 2>/dev/null || tail -20 "$OUT/qlen_run.txt"
timeout 200 bash python/run_gpu_tests.sh >"$OUT/pytest.log" 2>&1; echo "pytest rc $? $(tail -1 "$OUT/pytest.log")"
B=.deps/build
for tool in memcheck racecheck; do
  for t in test_gpu_decode test_gpu_attn; do
    filter='*'; [ $t = test_gpu_attn ] && filter='-*Prefill*'
    METRALE_GPU_TEST_ITERS=1 timeout 80 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/$t \
      --gtest_brief=1 --gtest_filter="$filter" >"$OUT/$t.$tool.log" 2>&1
    echo "$t $tool rc $? $(grep -E 'SUMMARY' "$OUT/$t.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) |ms total' "$OUT/$t.$tool.log" | head -2 | tr '\n' ' ')"
  done
done
tar czf "$OUT/call4.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.txt *.md *.csv *.json 2>/dev/null)
