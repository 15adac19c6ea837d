#!/usr/bin/env bash
# Session 25, call 4: the submitted build (.deps/build): pytest, then
# memcheck / racecheck of test_gpu_decode and of test_gpu_attn's query-run
# (runs kernel) tests (call 2 ran them on its prefill tests).
set -u
for z in .deps/build/*/*.xz; do [ -f "${z%.xz}" ] || tools/unxz.sh "$z" "${z%.xz}"; done
timeout 200 bash python/run_gpu_tests.sh >"$OUT/pytest.log" 2>&1; echo "pytest rc $? $(tail -1 "$OUT/pytest.log")"
B=.deps/build
for tool in memcheck racecheck; do
  for t in test_gpu_decode test_gpu_attn; do
    filter='*'; [ $t = test_gpu_attn ] && filter='-*Prefill*'
    METRALE_GPU_TEST_ITERS=1 timeout 70 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/$t \
      --gtest_brief=1 --gtest_filter="$filter" >"$OUT/$t.$tool.log" 2>&1
    echo "$t $tool rc $? $(grep -E 'SUMMARY' "$OUT/$t.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) |ms total' "$OUT/$t.$tool.log" | head -2 | tr '\n' ' ')"
  done
done
