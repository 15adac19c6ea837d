#!/usr/bin/env bash
# Session 25, call 1: main's (HEAD) test_gpu_attn / test_gpu_decode and
# the two waiting variants' test_gpu_attn, then their A/B against main:
#   pair-warp-copies: fp8 / NVFP4 prompts at d128 (pairs from the planner);
#   bf16-d64-n176: bf16 prompts at d64, also with CTA pairs forced.
set -u
A=.deps/ab
for b in main pair_warp_copies bf16_d64_n176; do
  tools/unxz.sh $A/$b/test_gpu_attn.xz /tmp/t_attn_$b
  timeout 150 /tmp/t_attn_$b --gtest_brief=1 >"$OUT/attn_$b.log" 2>&1
  echo "test_gpu_attn $b rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn_$b.log" | head -3 | tr '\n' ' ')"
done
tools/unxz.sh $A/main/test_gpu_decode.xz /tmp/t_dec
timeout 150 /tmp/t_dec --gtest_brief=1 >"$OUT/decode_main.log" 2>&1
echo "test_gpu_decode main rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/decode_main.log" | head -3 | tr '\n' ' ')"
ROUNDS=2 PREFILL_AB_ARGS="--formats fp8,nvfp4 --head-dim 128 --prefill on --shapes 1024,4096,8192,16384,2048+30720,ragged8" \
  tools/prefill_ab.sh "$OUT/ab_pwc" main=$A/main/prefill_bench.xz pwc=$A/pair_warp_copies/prefill_bench.xz 2>&1 | tail -14
ROUNDS=2 PREFILL_AB_ARGS="--formats bf16 --head-dim 64 --prefill on --shapes 1024,4096,8192,16384,2048+30720,ragged8" \
  PREFILL_AB_ARGS_n176pairs="--tile-pairs 1" \
  tools/prefill_ab.sh "$OUT/ab_d64" main=$A/main/prefill_bench.xz n176=$A/bf16_d64_n176/prefill_bench.xz \
  n176pairs=$A/bf16_d64_n176/prefill_bench.xz 2>&1 | tail -8
for b in pwc n176; do
  timeout 90 /tmp/prefill_ab_bins/$b/prefill_bench --formats bf16,fp8,nvfp4 --head-dim 128 --shapes 1024,8192,ragged8 --check 2>&1 |
    grep -E "^(bf16|fp8|nvfp4)" | cut -c1-150
done
timeout 60 /tmp/prefill_ab_bins/n176/prefill_bench --formats bf16 --head-dim 64 --shapes 1024,8192,ragged8 --check 2>&1 |
  grep -E "^bf16" | cut -c1-150
tar czf "$OUT/call1.tgz" -C "$OUT" $(cd "$OUT" && ls -d *.log ab_* 2>/dev/null)
