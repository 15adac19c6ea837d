#!/usr/bin/env bash
# Session 25, call 3: the submitted kernels (.deps/build): the prefill tables
# (issue 18) at d128, d64, d256 with the peers, one run.
set -u
TESTS=0 PYTEST=0 BENCH=0 PREFILL_BENCH=1 PREFILL_DIMS="128 64 256" METRALE_BUILD_DIR=.deps/build tools/device_run.sh \
  >"$OUT/prefill_run.txt" 2>&1
cat "$OUT/prefill_tables.md" 2>/dev/null || tail -30 "$OUT/prefill_run.txt"
