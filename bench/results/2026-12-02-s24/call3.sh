#!/usr/bin/env bash
# Session 24, call 3: CTA pairs as a template parameter, the remote release without a GPU-scope MEMBAR (.deps/ab/main, commit
# in its source file) against the kernels before them (.deps/ab/base):
# tests, sanitizers, then the prompts' A/B (pairs, and the same build with
# --tile-pairs 0) at d128, d64, d256.
set -u
A=.deps/ab
for z in $A/main/*.xz; do tools/unxz.sh "$z" "${z%.xz}"; done
for t in test_gpu_attn test_gpu_decode; do
  timeout 240 $A/main/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1
  echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | head -3 | tr '\n' ' ')"
done
grep -B2 -A8 "Failure" "$OUT/test_gpu_attn.log" | head -40
for tool in racecheck; do
  METRALE_GPU_TEST_ITERS=2 timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 $A/main/test_gpu_attn \
    --gtest_brief=1 --gtest_filter='*PrefillKernelMatches*' >"$OUT/attn.$tool.log" 2>&1
  echo "$tool rc $? $(grep -E 'SUMMARY' "$OUT/attn.$tool.log" | tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn.$tool.log" | head -2 | tr '\n' ' ')"
done
timeout 120 $A/main/prefill_bench --formats bf16,fp8,nvfp4 --head-dim 128 --shapes 1024,8192,2048+30720,ragged8 --check \
  >"$OUT/check128.log" 2>&1; echo "check rc $?"; grep -E "^(bf16|fp8|nvfp4)" "$OUT/check128.log" | cut -c1-200
for d in 128 64 256; do
  echo "== d$d"
  ROUNDS=2 PREFILL_AB_ARGS="--formats bf16,fp8,nvfp4 --head-dim $d --prefill on --shapes 1024,4096,8192,16384,2048+30720,ragged8" \
    PREFILL_AB_ARGS_alone="--tile-pairs 0" \
    tools/prefill_ab.sh "$OUT/ab$d" base=$A/base/prefill_bench.xz pairs=$A/main/prefill_bench.xz alone=$A/main/prefill_bench.xz
done
tar czf "$OUT/call3.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) ab128 ab64 ab256
