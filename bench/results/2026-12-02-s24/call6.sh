#!/usr/bin/env bash
# Session 24, call 6: the final commit's binaries (.deps/build): test_gpu_attn
# twice (new seeds; its planner-chosen plans now pair from 2048 attended
# positions), test_planner, racecheck of the prefill tests, and pairs on / off
# at 2048 tokens in two alternated rounds.
set -u
B=.deps/build
for z in $B/*/*.xz; do tools/unxz.sh "$z" "${z%.xz}"; done
for i in 1 2; do
  timeout 150 $B/tests/test_gpu_attn --gtest_brief=1 >"$OUT/attn_$i.log" 2>&1
  echo "test_gpu_attn run $i rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn_$i.log" | head -3 | tr '\n' ' ')"
done
$B/tests/test_planner --gtest_brief=1 2>&1 | tail -1
METRALE_GPU_TEST_ITERS=2 timeout 150 compute-sanitizer --tool racecheck --error-exitcode 99 $B/tests/test_gpu_attn \
  --gtest_brief=1 --gtest_filter='*Prefill*' >"$OUT/attn.racecheck.log" 2>&1
echo "racecheck rc $? $(grep -E 'SUMMARY' "$OUT/attn.racecheck.log" | tail -1)"
for r in 1 2; do
  for pairs in 0 1; do
    $B/bench/prefill_bench --formats bf16,fp8,nvfp4 --head-dim 128 --prefill on --tile-pairs $pairs --shapes 2048 \
      2>&1 | grep -E "^(bf16|fp8|nvfp4)" | cut -c1-100
  done
done
