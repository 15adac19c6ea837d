#!/usr/bin/env bash
# Session 24, call 4: the submitted kernels (b6b978f's binaries, .deps/build).
# Every test binary, sanitizers of test_gpu_attn's prefill tests (CTA pairs
# forced on / off / the planner's at random), then the prefill tables
# (issue 18) at d128, d64, d256 with the peers, one run.
set -u
METRALE_BUILD_DIR=.deps/build PYTEST=0 BENCH=0 tools/device_run.sh >"$OUT/device_run.txt" 2>&1
cat "$OUT/summary.txt" 2>/dev/null || tail -20 "$OUT/device_run.txt"
B=.deps/build
for tool in racecheck memcheck; do
  METRALE_GPU_TEST_ITERS=2 timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*Prefill*' >"$OUT/attn.$tool.log" 2>&1
  echo "attn prefill $tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn.$tool.log" | head -2 | tr '\n' ' ')"
done
TESTS=0 PYTEST=0 BENCH=0 PREFILL_BENCH=1 PREFILL_DIMS="128 64 256" METRALE_BUILD_DIR=.deps/build tools/device_run.sh \
  >"$OUT/prefill_run.txt" 2>&1
cat "$OUT/prefill_tables.md"
tar czf "$OUT/call4.tgz" -C "$OUT" $(cd "$OUT" && ls *.log *.txt *.json *.csv *.md 2>/dev/null)
