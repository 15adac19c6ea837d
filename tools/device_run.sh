#!/usr/bin/env bash
# The one script for the H200 machine: build (unless prebuilt binaries were
# carried), run every test binary (GPU tests included), optionally the GPU
# tests under compute-sanitizer, the Python tests, then the benchmarks; a
# summary table last. Logs and tables go to $OUT (default ./out).
#
#   tools/device_run.sh                  # build + tests + decode / cache-write bench + peers
#   SANITIZE=1 tools/device_run.sh       # + memcheck and racecheck of the GPU suites
#     (SANITIZE_TESTS binaries, SANITIZE_FILTER a gtest filter, SANITIZE_TIMEOUT s each)
#   BENCH_ARGS="--mode oracle" tools/device_run.sh
#   METRALE_BUILD_DIR=.deps/build tools/device_run.sh   # use carried binaries
#
#   TESTS=0 / PYTEST=0 / BENCH=0 / PEERS=0 / CLI=0 skip parts;
#   TEST_TIMEOUT (s per test binary, 300), TEST_FILTER (a gtest filter), PYTEST_TIMEOUT (400 s),
#   PYTEST_ARGS to pytest, PEERS_ARGS to bench/peers.py (e.g. "--peers sdpa");
#   QLEN_BENCH=1: q_len 1, 2, 4, 8, 16 (QLENS) at the verification shapes with the peers, one table
#     (tools/q_len_table.py; QLEN_SHAPES, QLEN_PEERS, QLEN_T1=0 leaves out the one-column-tile rows);
#   PREFILL_BENCH=1: prompts, a chunk over a cached prefix, a ragged batch, with the peers
#     (tools/prefill_tables.py; PREFILL_DIMS head dims, PREFILL_ARGS to prefill_bench,
#     PREFILL_PEERS_ARGS to bench/prefill_peers.py, PREFILL_PEERS=0 skips the peers);
#   HF=1 runs bench/hf_generate.py; CP_BENCH=1 the multi-GPU benchmark.
# The Python tests need .whl/ carried too (python/run_gpu_tests.sh says how).
# GoogleTest and the CLI/JSON headers are not installed there: they travel
# in .deps/ (tools/prepare_device_carry.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${METRALE_BUILD_DIR:-build-device}
# Carried binaries come xz-compressed (tools/prepare_device_carry.sh): unpack
# them beside themselves (tools/unxz.sh).
for z in "$BUILD"/*.xz "$BUILD"/*/*.xz; do
  [ -f "$z" ] || continue
  tools/unxz.sh "$z" "${z%.xz}"
done

if [ "${TESTS:-1}" = 1 ] && [ ! -x "$BUILD/tests/test_gpu_decode" ]; then
  echo "== building in $BUILD"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMETRALE_GTEST_SOURCE="$PWD/.deps/googletest" \
    -DMETRALE_THIRD_PARTY_INCLUDE="$PWD/.deps/include" >"$OUT/configure.log" 2>&1 &&
    ninja -C "$BUILD" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1; }
fi
# NCCL-linked binaries: use the NCCL of the machine's Python (nvidia-nccl) when
# the toolkit has none.
if [ -x "$BUILD/tests/test_cp_nccl" ] && ldd "$BUILD/tests/test_cp_nccl" | grep -q 'nccl.*not found'; then
  nccl_lib=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib:${LD_LIBRARY_PATH:-}"
fi
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"

# The GPU's clocks, power and throttle reasons before each timed part
# (gpu_state.txt), so that a run-to-run difference can be told from a slow
# clock.
gpu_state() {
  local q=clocks.sm,clocks.max.sm,power.draw,temperature.gpu r  # the reasons' field was renamed (drivers 535+)
  r=$(nvidia-smi --query-gpu=$q,clocks_event_reasons.active --format=csv,noheader 2>/dev/null ||
    nvidia-smi --query-gpu=$q,clocks_throttle_reasons.active --format=csv,noheader 2>/dev/null ||
    nvidia-smi --query-gpu=$q --format=csv,noheader 2>&1)
  printf '%-28s %s\n' "$1" "$r" >>"$OUT/gpu_state.txt"
}
summary=()
count() { grep -E "^\[  $1  \] [0-9]+ test" "$2" | head -1 | awk '{print $4}'; }
for t in "$BUILD"/tests/test_*; do
  [ "${TESTS:-1}" = 1 ] && [ -x "$t" ] && [ -f "$t" ] && [ "${t%.xz}" = "$t" ] || continue
  name=$(basename "$t")
  timeout "${TEST_TIMEOUT:-300}" "$t" --gtest_brief=1 ${TEST_FILTER:+--gtest_filter=$TEST_FILTER} >"$OUT/$name.log" 2>&1
  rc=$?
  summary+=("$(printf '%-24s passed %4s  failed %3s  skipped %3s  rc %d' "$name" "$(count PASSED "$OUT/$name.log")" \
    "$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$OUT/$name.log")" "$(count SKIPPED "$OUT/$name.log")" $rc)")
  [ $rc -eq 0 ] || tail -30 "$OUT/$name.log"
done

if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    for t in ${SANITIZE_TESTS:-test_gpu_decode test_gpu_cache_write test_gpu_attn}; do
      METRALE_GPU_TEST_ITERS=8 timeout "${SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool $tool --error-exitcode 99 \
        "$BUILD/tests/$t" --gtest_brief=1 --gtest_filter="${SANITIZE_FILTER:--*TensOfThousands*:*PlannerRuns*:*Large*:*ManyTokens*}" \
        >"$OUT/$t.$tool.log" 2>&1
      summary+=("$(printf '%-24s %-9s rc %d  %s' "$t" "$tool" $? "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$t.$tool.log" | tail -1)")")
    done
  done
fi

# The Python package's tests, GPU cases included (links this build's library).
if [ "${PYTEST:-1}" = 1 ] && python3 -c "import torch, nanobind" 2>/dev/null; then
  # The extension compiles the library itself with this machine's compiler:
  # linking a libmetrale.a built by another GCC crashed in libstdc++ code
  # (ostream inlines of two GCC versions in one module).
  timeout "${PYTEST_TIMEOUT:-400}" bash python/run_gpu_tests.sh ${PYTEST_ARGS:-} >"$OUT/pytest.log" 2>&1
  summary+=("$(printf '%-24s rc %d  %s' "python (pytest)" $? "$(tail -1 "$OUT/pytest.log")")")
fi

if [ "${BENCH:-1}" = 1 ]; then
  gpu_state "decode bench"
  "$BUILD/bench/metrale_bench" ${BENCH_ARGS:-} --csv "$OUT/bench.csv" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  # GPU decode against the CPU backend (exit 1 on a failure).
  "$BUILD/bench/metrale_bench" --mode check --shapes 1x1000,4x3000,16x513,33x200,64x4096 --json "$OUT/bench_check.json" >"$OUT/bench_check.log" 2>&1
  summary+=("$(printf '%-24s rc %d  %s' "metrale_bench check" $? "$(grep -c ' ok$' "$OUT/bench_check.log") ok")")
  # The cache write on the same shapes (inputs rotated from HBM).
  "$BUILD/bench/metrale_bench" --op write --csv "$OUT/bench_write.csv" 2>&1 | tee "$OUT/bench_write.log"
  # Peers on the same shapes in the same run (PyTorch is on the GPU machine).
  if [ "${PEERS:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 bench/peers.py --metrale-csv "$OUT/bench.csv" --csv "$OUT/peers.csv" ${PEERS_ARGS:-} 2>&1 |
      tee "$OUT/peers.log"
  fi
fi
# A transformers model generating through metrale: the Qwen3-shaped
# model of bench/hf_generate.py against SDPA and eager, every format.
if [ "${HF:-0}" = 1 ] && python3 -c "import torch, transformers" 2>/dev/null; then
  PYTHONPATH="${SITE:-/tmp/metrale-site}${PYTHONPATH:+:$PYTHONPATH}" python3 bench/hf_generate.py 2>&1 | tee "$OUT/hf_generate.txt"
  summary+=("$(printf '%-24s rc %d' "hf_generate.py" ${PIPESTATUS[0]})")
fi
# Multi-token queries: q_len 1, 2, 4, 8, 16 (QLENS) per sequence at the three
# verification shapes, every format, the planner's column tiles and one
# column tile forced (the A/B of reading the pages once per 16 columns),
# the peers at the same q_len, and one table (tools/q_len_table.py).
if [ "${QLEN_BENCH:-0}" = 1 ]; then
  QS=${QLEN_SHAPES:-1x32768,16x8192,64x4096}
  for n in ${QLENS:-1 2 4 8 16}; do
    gpu_state "q_len $n"
    "$BUILD/bench/metrale_bench" --shapes "$QS" --q-len $n --csv "$OUT/qlen_$n.csv" 2>&1 | tee -a "$OUT/qlen.log"
    [ $n -gt 2 ] && [ "${QLEN_T1:-1}" = 1 ] && "$BUILD/bench/metrale_bench" --shapes "$QS" --q-len $n --col-tiles 1 --csv "$OUT/qlen_${n}_t1.csv" 2>&1 |
      tee -a "$OUT/qlen.log"
    if [ "${PEERS:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
      PYTHONUNBUFFERED=1 python3 bench/peers.py --shapes "$QS" --q-len $n --peers "${QLEN_PEERS:-all}" \
        --metrale-csv "$OUT/qlen_$n.csv" --csv "$OUT/qlen_peers_$n.csv" 2>&1 | tee -a "$OUT/qlen_peers.log"
    fi
  done
  python3 tools/q_len_table.py "$OUT" | tee "$OUT/qlen_table.md"
  summary+=("$(printf '%-24s rc %d' "q_len table" $?)")
fi
# Prefill: prompts, a chunk over a cached prefix, a ragged batch,
# every format through the planner's kernel, and the peers on the same shapes.
if [ "${PREFILL_BENCH:-0}" = 1 ]; then
  for d in ${PREFILL_DIMS:-128}; do
    gpu_state "prefill d$d"
    "$BUILD/bench/prefill_bench" --head-dim $d ${PREFILL_ARGS:-} --json "$OUT/prefill_d$d.json" 2>&1 | tee -a "$OUT/prefill.log"
    summary+=("$(printf '%-24s rc %d' "prefill_bench d$d" ${PIPESTATUS[0]})")
    if [ "${PREFILL_PEERS:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
      PYTHONUNBUFFERED=1 python3 bench/prefill_peers.py --head-dim $d ${PREFILL_PEERS_ARGS:-} --csv "$OUT/prefill_peers_d$d.csv" 2>&1 |
        tee -a "$OUT/prefill.log"
    fi
  done
  python3 tools/prefill_tables.py "$OUT/prefill.log" >"$OUT/prefill_tables.md" 2>&1
fi
# Context-parallel scaling where the machine has several GPUs.
if [ "${CP_BENCH:-0}" = 1 ] && [ -x "$BUILD/bench/cp_bench" ]; then
  NCCL_DEBUG=WARN "$BUILD/bench/cp_bench" --gpus "$(nvidia-smi -L | wc -l)" 2>&1 | tee "$OUT/cp_bench.log" ||
    NCCL_DEBUG=WARN "$BUILD/bench/cp_bench" --gpus "$(nvidia-smi -L | wc -l)" --no-graph 2>&1 | tee -a "$OUT/cp_bench.log"
fi
# The main job, as a newcomer runs it, then its GPU subcommands (CLI=0 skips).
if [ -x "$BUILD/metrale" ]; then
  "$BUILD/metrale" 2>&1 | tee "$OUT/metrale.txt"
  if [ "${CLI:-1}" = 1 ]; then
    M="$BUILD/metrale"
    "$M" accuracy --json "$OUT/cli_accuracy.json" >"$OUT/cli_accuracy.log" 2>&1
    summary+=("$(printf '%-24s rc %d' "metrale accuracy" $?)")
    # The default budget (4 MiB) is the limit for every format; 512 MiB
    # with 2048 requests took 4 minutes there and only bf16 hit its budget.
    "$M" serve-sim --json "$OUT/cli_serve.json" >"$OUT/cli_serve.log" 2>&1
    summary+=("$(printf '%-24s rc %d' "metrale serve-sim" $?)")
  fi
fi

echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
# The device tool returns few files from $OUT: the tables come back as they
# are, everything else (logs, JSON) in one archive.
(cd "$OUT" && rest=$(ls -A | grep -vxE 'summary\.txt|bench\.csv|bench_write\.csv|peers\.csv|qlen_table\.md|prefill\.log|prefill_tables\.md|hf_generate\.txt|results\.tgz') &&
  [ -n "$rest" ] && tar czf results.tgz $rest && rm -rf $rest)
