#!/usr/bin/env bash
# Session 24, call 1: is the prefill kernel's time the bytes its stages
# move? The knockout ko-half-loads (bench/variants) loads half of every
# K / V tile (bf16: the even 16-position groups' TMA boxes; fp8 / NVFP4:
# half of each producer thread's rows; the rest keeps stale values, so the
# tensor cores see real data), against main, prompts at d128. And how many
# clusters of 2 CTAs of the prefill kernel's shape stay resident.
set -u
nvcc -gencode=arch=compute_90a,code=sm_90a -o /tmp/cluster_probe bench/results/2026-12-02-s24/cluster_probe.cu && /tmp/cluster_probe
nvidia-smi dmon -s pc -d 1 >"$OUT/dmon.txt" 2>&1 &
dm=$!
ROUNDS=2 PREFILL_AB_ARGS="--formats bf16,fp8,nvfp4 --head-dim 128 --shapes 1024,4096,8192,16384,2048+30720" \
  tools/prefill_ab.sh "$OUT/ab" main=.deps/ab/main/prefill_bench.xz ko=.deps/ab/ko_half_loads/prefill_bench.xz
kill $dm
tar czf "$OUT/call1.tgz" -C "$OUT" ab dmon.txt
