#!/usr/bin/env bash
# Session 25, call 3: the submitted kernels (.deps/build): the prefill tables
# (issue 18) at d128, d64, d256 with the peers, one run; first test_gpu_attn
# and test_planner of this build (the planner's pairs threshold changed after call 2).
set -u
for z in .deps/build/*/*.xz; do [ -f "${z%.xz}" ] || tools/unxz.sh "$z" "${z%.xz}"; done
for t in test_gpu_attn test_planner; do
  timeout 150 .deps/build/tests/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1
  echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | head -2 | tr '\n' ' ')"
done
TESTS=0 PYTEST=0 BENCH=0 PREFILL_BENCH=1 PREFILL_DIMS="128 64 256" METRALE_BUILD_DIR=.deps/build tools/device_run.sh \
  >"$OUT/prefill_run.txt" 2>&1
cat "$OUT/prefill_tables.md" 2>/dev/null || tail -30 "$OUT/prefill_run.txt"
