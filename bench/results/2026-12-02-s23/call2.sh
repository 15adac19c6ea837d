#!/usr/bin/env bash
# Session 23, call 2: the head_dim-parts runs kernel (NVFP4) on the H200.
# Tests (new binaries), then A/B against HEAD 04fd111's metrale_bench
# (.deps/ab/head), then forced variants at q_len 8, then the sanitizers.
set -u
B=.deps/build
for z in $B/*.xz $B/*/*.xz .deps/ab/head/*.xz; do tools/unxz.sh "$z" "${z%.xz}"; done
for t in test_gpu_attn test_gpu_decode test_planner; do
  timeout 300 $B/tests/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1
  echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
done
S=1x32768,16x8192,64x4096
for q in 2 4; do
  ROUNDS=2 BENCH_AB_WRITE=0 BENCH_ARGS="--formats nvfp4,fp8,bf16 --shapes $S --q-len $q" \
    tools/bench_ab.sh .deps/ab/head/metrale_bench $B/bench/metrale_bench "$OUT/ab_q$q" >/dev/null 2>&1
  echo "== A/B q_len $q (A = 04fd111, B = new)"; cat "$OUT/ab_q$q/ab.txt"
done
# q_len 1 (decode) and 8: the planner's (prefill kernel at 8) against forced head_dim parts.
for r in 1 2; do
  $B/bench/metrale_bench --formats nvfp4 --shapes $S --q-len 1 --csv "$OUT/q1_$r.csv" >"$OUT/q1_$r.log" 2>&1
  $B/bench/metrale_bench --formats nvfp4 --shapes $S --q-len 8 --csv "$OUT/q8_plan_$r.csv" >"$OUT/q8_plan_$r.log" 2>&1
  $B/bench/metrale_bench --formats nvfp4 --shapes $S --q-len 8 --col-tiles 4 --head-dim-parts 2 \
    --csv "$OUT/q8_hp4_$r.csv" >"$OUT/q8_hp4_$r.log" 2>&1
  $B/bench/metrale_bench --formats nvfp4 --shapes $S --q-len 8 --col-tiles 2 --head-dim-parts 2 \
    --csv "$OUT/q8_hp2_$r.csv" >"$OUT/q8_hp2_$r.log" 2>&1
done
grep -h "nvfp4" "$OUT"/q1_2.log "$OUT"/q8_plan_2.log "$OUT"/q8_hp4_2.log "$OUT"/q8_hp2_2.log | cut -c1-200
for tool in racecheck memcheck; do
  METRALE_GPU_TEST_ITERS=4 timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*RaggedRuns*' >"$OUT/attn.$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1)"
done
