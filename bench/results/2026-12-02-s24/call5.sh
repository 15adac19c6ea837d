#!/usr/bin/env bash
# Session 24, call 5: the submitted kernels (b6b978f's binaries, .deps/build):
# the pairs' threshold between 1024 and 4096 tokens (forced on / off), the
# q_len table (issue 17) with its peers, then pytest.
set -u
B=.deps/build
for z in $B/*/*.xz $B/*.xz; do [ -f "${z%.xz}" ] || tools/unxz.sh "$z" "${z%.xz}"; done
for pairs in 0 1; do
  $B/bench/prefill_bench --formats bf16,fp8,nvfp4 --head-dim 128 --prefill on --tile-pairs $pairs \
    --shapes 1024,2048,3072,4096 2>&1 | grep -E "^(bf16|fp8|nvfp4)" | cut -c1-110
  $B/bench/prefill_bench --formats bf16 --head-dim 256 --prefill on --tile-pairs $pairs \
    --shapes 1024,2048,4096 2>&1 | grep -E "^bf16" | cut -c1-110
done
TESTS=0 PYTEST=0 BENCH=0 QLEN_BENCH=1 QLEN_T1=0 METRALE_BUILD_DIR=$B tools/device_run.sh >"$OUT/qlen_run.txt" 2>&1
cat "$OUT/qlen_table.md" 2>/dev/null || tail -20 "$OUT/qlen_run.txt"
timeout 300 bash python/run_gpu_tests.sh >"$OUT/pytest.log" 2>&1; echo "pytest rc $? $(tail -1 "$OUT/pytest.log")"
