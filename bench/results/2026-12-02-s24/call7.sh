#!/usr/bin/env bash
# Session 24, call 7: bench/variants/bf16-d64-n176.patch (bf16 at head_dim 64
# in tiles of 176 positions, 3 stages) against main (03d81c7): its
# test_gpu_attn, then bf16 d64 prompts, two alternated rounds, the variant
# also with CTA pairs forced.
set -u
A=.deps/ab
tools/unxz.sh $A/bf16_d64_n176/test_gpu_attn.xz /tmp/t_attn
timeout 100 /tmp/t_attn --gtest_brief=1 >"$OUT/attn.log" 2>&1
echo "test_gpu_attn (variant) rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/attn.log" | head -3 | tr '\n' ' ')"
ROUNDS=2 PREFILL_AB_ARGS="--formats bf16 --head-dim 64 --prefill on --shapes 1024,4096,8192,16384,2048+30720,ragged8" \
  PREFILL_AB_ARGS_n176pairs="--tile-pairs 1" \
  tools/prefill_ab.sh "$OUT/ab" main=$A/main/prefill_bench.xz n176=$A/bf16_d64_n176/prefill_bench.xz \
  n176pairs=$A/bf16_d64_n176/prefill_bench.xz 2>&1 | tail -8
timeout 60 /tmp/prefill_ab_bins/n176/prefill_bench --formats bf16 --head-dim 64 --shapes 1024,8192,ragged8 --check 2>&1 |
  grep -E "^bf16" | cut -c1-160
