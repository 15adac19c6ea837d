#!/usr/bin/env bash
# Session 25, call 4: the submitted kernels (.deps/build): the q_len table
# (issue 17) with its peers, one run, then pytest.
set -u
TESTS=0 PYTEST=0 BENCH=0 QLEN_BENCH=1 QLEN_T1=0 METRALE_BUILD_DIR=.deps/build tools/device_run.sh >"$OUT/qlen_run.txt" 2>&1
cat "$OUT/qlen_table.md" 2>/dev/null || tail -20 "$OUT/qlen_run.txt"
timeout 300 bash python/run_gpu_tests.sh >"$OUT/pytest.log" 2>&1; echo "pytest rc $? $(tail -1 "$OUT/pytest.log")"
