#!/usr/bin/env bash
# Session 23, call 5: the submitted commit. Every test binary, sanitizers of
# the runs tests and test_gpu_decode's split-K tests, the d256 NVFP4 q_len
# rows, then pytest.
set -u
METRALE_BUILD_DIR=.deps/build PYTEST=0 BENCH=0 tools/device_run.sh >"$OUT/device_run.txt" 2>&1
cat "$OUT/summary.txt" 2>/dev/null || tail -20 "$OUT/device_run.txt"
B=.deps/build
for tool in racecheck memcheck; do
  METRALE_GPU_TEST_ITERS=4 timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*RaggedRuns*:*CorruptPages*' >"$OUT/attn.$tool.log" 2>&1
  echo "attn $tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1)"
done
for q in 1 2 4 8; do
  $B/bench/metrale_bench --formats nvfp4 --head-dim 256 --shapes 1x32768,16x8192,64x4096 --q-len $q \
    --csv "$OUT/d256_q$q.csv" 2>&1 | grep nvfp4 | cut -c1-150
done
timeout 420 bash python/run_gpu_tests.sh >"$OUT/pytest.log" 2>&1; echo "pytest rc $? $(tail -1 "$OUT/pytest.log")"
