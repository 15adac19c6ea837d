#!/usr/bin/env bash
# Session 23, call 4: head_dim parts kept for NVFP4 at head_dim 256 only,
# the exchange through a CTA barrier per step. Tests, sanitizers of the
# runs tests, then A/B against HEAD 04fd111 (.deps/ab/head).
set -u
B=.deps/build
for z in $B/*/*.xz .deps/ab/head/metrale_bench.xz; do tools/unxz.sh "$z" "${z%.xz}"; done
for t in test_gpu_attn test_gpu_decode test_planner; do
  timeout 300 $B/tests/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1
  echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
done
for tool in racecheck memcheck; do
  METRALE_GPU_TEST_ITERS=4 timeout 280 compute-sanitizer --tool $tool --error-exitcode 99 $B/tests/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*RaggedRuns*:*CorruptPages*' >"$OUT/attn.$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn.$tool.log" | head -2 | tr '\n' ' ')"
done
S=1x32768,16x8192,64x4096
for d in 256 128; do
  for q in 2 4; do
    f=nvfp4; [ $d = 128 ] && f=nvfp4,fp8,bf16
    ROUNDS=2 BENCH_AB_WRITE=0 BENCH_ARGS="--formats $f --head-dim $d --shapes $S --q-len $q" \
      tools/bench_ab.sh .deps/ab/head/metrale_bench $B/bench/metrale_bench "$OUT/ab_d${d}_q$q" >/dev/null 2>&1
    echo "== A/B d$d q_len $q (A = 04fd111, B = new)"; cat "$OUT/ab_d${d}_q$q/ab.txt"
    grep -h "q$q" "$OUT/ab_d${d}_q$q/decode_B_2.log" | cut -c1-150
  done
done
tar czf "$OUT/call4.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) ab_*
