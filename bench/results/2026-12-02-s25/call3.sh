#!/usr/bin/env bash
# Session 25, call 3: the submitted kernels (.deps/build): test_gpu_attn and
# test_planner of this build (the planner's pairs threshold changed after
# call 2), the prefill tables (issue 18) at d128, d64, d256 with the peers,
# then the q_len table (issue 17) with its peers, in what is left of the
# call's 10 minutes (two refused starts had cost device time).
set -u
for z in .deps/build/*/*.xz; do [ -f "${z%.xz}" ] || tools/unxz.sh "$z" "${z%.xz}"; done
for t in test_gpu_attn test_planner; do
  timeout 150 .deps/build/tests/$t --gtest_brief=1 >"$OUT/$t.log" 2>&1
  echo "$t rc $? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | head -2 | tr '\n' ' ')"
done
TESTS=0 PYTEST=0 BENCH=0 PREFILL_BENCH=1 PREFILL_DIMS="128 64 256" METRALE_BUILD_DIR=.deps/build tools/device_run.sh \
  >"$OUT/prefill_run.txt" 2>&1
cat "$OUT/prefill_tables.md" 2>/dev/null || tail -30 "$OUT/prefill_run.txt"
echo "prefill tables done at ${SECONDS} s"
left=$((585 - SECONDS))
TESTS=0 PYTEST=0 BENCH=0 QLEN_BENCH=1 QLEN_T1=0 METRALE_BUILD_DIR=.deps/build timeout $left tools/device_run.sh \
  >"$OUT/qlen_run.txt" 2>&1
echo "qlen rc $? at ${SECONDS} s"
cat "$OUT/qlen_table.md" 2>/dev/null || tail -20 "$OUT/qlen_run.txt"
