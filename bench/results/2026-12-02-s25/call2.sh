#!/usr/bin/env bash
# Session 25, call 2: the submitted kernels (.deps/build, the CTA pairs'
# warp copies and bf16 head_dim 64 in 176-position tiles merged): every test
# binary, racecheck / memcheck of test_gpu_attn's prefill tests (pairs forced
# on / off / the planner's at random) and of test_gpu_decode, then fp8 pairs
# on / off between 2048 and 4096 tokens (the planner's fp8 threshold, 4096).
set -u
METRALE_BUILD_DIR=.deps/build PYTEST=0 BENCH=0 tools/device_run.sh >"$OUT/device_run.txt" 2>&1
cat "$OUT/summary.txt" 2>/dev/null || tail -20 "$OUT/device_run.txt"
B=.deps/build
for tool in racecheck memcheck; do
  METRALE_GPU_TEST_ITERS=2 timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*Prefill*' >"$OUT/attn.$tool.log" 2>&1
  echo "attn prefill $tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn.$tool.log" | head -2 | tr '\n' ' ')"
done
for pairs in 0 1; do
  timeout 60 $B/bench/prefill_bench --formats fp8,nvfp4 --head-dim 128 --prefill on --tile-pairs $pairs \
    --shapes 2048,3072,4096 2>&1 | grep -E "^(fp8|nvfp4)" | cut -c1-110
done
tar czf "$OUT/call2.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.txt 2>/dev/null)
