#!/usr/bin/env bash
# One device call's worth of prefill A/B over the builds in .deps/ab
# (tools/build_prefill_variants.sh), in groups, each through
# tools/prefill_ab.sh (rounds alternate the builds), then ncu of the base
# build's bf16 kernel:
#   1. bf16 prompt timing at d128 and d64 (no --check: the knockout builds,
#      ko_*, compute wrong results on purpose), and the real bf16 variants
#      once with --check;
#   2. the dequantising formats' prompts with --check (each build's prefill
#      kernel against its runs kernel, rel. L2 <= 2e-2, no NaN), the runs
#      kernel at q_len 2 and 4 over fp8 / NVFP4, and ncu of main's bf16;
#   3. the verification shapes (q_len 2-16) of every format on the prefill
#      kernel of each build, and on main's runs kernel, with --check;
#   4. main's launch orders, forced (--tile-band), at d128 and d256;
#   5. decode and the runs kernel at the q_len table's shapes (metrale_bench,
#      q_len 1 / 2 / 4 / 8, every format) of the builds that change them
#      against main (tools/bench_ab.sh).
# A group names builds by their .deps/ab directory; missing ones are left out.
#
#   OUT=... tools/prefill_ab_suite.sh        (device_run.sh style: carry ".deps/ab")
#   SUITE_PART=1 (group 1), 2 (the dequantising prompts, the runs kernel and
#   ncu), 3 (verification), 4 (main's launch orders, forced), 5 (decode and
#   the runs kernel), a list ("3 1 2": the groups run in the order 3, 1, 2), or all: the
#   whole suite may not fit one 10-minute call; SUITE_NCU=0 leaves out ncu; ROUNDS (2) as in prefill_ab.sh;
#   DQ_BUILDS (space-separated) replaces the dequantising group's builds;
#   RUNS_BUILDS (space-separated, none by default) names part 5's variants
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/logs"
AB=.deps/ab
pick() {  # NAME... -> name=binary for the builds that are there
  local n
  for n in "$@"; do [ -f "$AB/$n/prefill_bench.xz" ] && echo "$n=$AB/$n/prefill_bench.xz"; done
}
part=${SUITE_PART:-all}
wants() { [ "$part" = all ] || [[ " $part " == *" $1 "* ]]; }
run_group() {  # PART TITLE ARGS NAME...: the table in $OUT/ab_TITLE.txt, the logs in logs/TITLE
  wants "$1" || return 0
  local title=$2 args=$3
  shift 3
  mapfile -t builds < <(pick "$@")
  { echo "== $title ($args)"
    PREFILL_AB_TESTS=0 PREFILL_AB_ARGS="$args" tools/prefill_ab.sh "$OUT/logs/$title" "${builds[@]}"; } 2>&1 |
    tee "$OUT/ab_$title.txt"
}
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv >"$OUT/logs/gpu_state.txt" 2>&1

# Part 3 first: the verification shapes are issue 17's misses.
# A group's builds: main and the variants that change its kernels (add a
# new variant's name where it belongs).
dq_builds=(${DQ_BUILDS:-main})
# Verification on the prefill kernel (--prefill on; the runs kernel's times
# are main's --prefill off rows): q_len 2-16 at GQA 4, every format.
verify_shapes=1x2+32766,1x4+32764,1x8+32760,16x8+8184,64x8+4088,1x16+32752
run_group 3 verify "--head-dim 128 --prefill on --shapes $verify_shapes --check" "${dq_builds[@]}"
ROUNDS=1 run_group 3 verify_runs_kernel "--head-dim 128 --prefill off --shapes $verify_shapes --check" main

# Names are .deps/ab directories: main and bench/variants/<name>.patch with
# '-' as '_' (tools/build_prefill_variants.sh); ko_* are the knockouts.
bf16_real=(main)
run_group 1 bf16_d128 "--formats bf16 --head-dim 128 --shapes 1024,8192,16384,2048+30720" \
  "${bf16_real[@]}" ko_no_softmax ko_no_exp ko_no_pv ko_half_loads
# The real bf16 variants' results, once (--check: against the runs kernel).
ROUNDS=1 run_group 1 bf16_check "--formats bf16 --head-dim 128 --shapes 1024,2048+30720 --check" "${bf16_real[@]}"
run_group 1 bf16_d64 "--formats bf16 --head-dim 64 --shapes 8192" "${bf16_real[@]}" ko_no_softmax ko_no_exp

run_group 2 dq_prompts "--formats fp8,nvfp4 --head-dim 128 --shapes 1024,8192,2048+30720 --check" "${dq_builds[@]}"
for d in 64 256; do
  ROUNDS=1 run_group 2 dq_prompts_d$d "--formats fp8,nvfp4 --head-dim $d --shapes 1024,8192,ragged8 --check" "${dq_builds[@]}"
done
# The runs kernel at q_len 2 and 4 (two column tiles from q_len 3 at GQA 4).
run_group 2 runs_q2_q4 "--head-dim 128 --formats fp8,nvfp4 --prefill off --check --shapes \
1x2+32766,16x2+8190,64x2+4094,1x4+32764,16x4+8188,64x4+4092" main

# ncu of the base build (bf16, 8192 tokens): where its consumers' cycles go,
# beside the knockouts above.
if [ "${SUITE_NCU:-1}" = 1 ] && wants 2; then
  base=${PREFILL_AB_BINS:-/tmp/prefill_ab_bins}/main
  [ -x "$base" ] || tools/unxz.sh "$AB/main/prefill_bench.xz" "$base"
  tools/prefill_ncu.sh "$base" "$OUT" --formats bf16 --head-dim 128 --shapes 8192
  echo "ncu rc $?"
  mv "$OUT/prefill_ncu.log" "$OUT/prefill_ncu_sass.csv.gz" "$OUT/logs/"
fi
# Part 4: main's own launch orders, forced (prefill_bench --tile-band; no
# build): the planner's against the 3-D grid and bands of 8 / 16 / 32 tiles,
# where the planner bands (above L2: bf16 d128 from 16384, the chunk,
# ragged8; d256 from 8192). Session 20, call 5 (one round): bf16 16384 549
# TFLOPS with bands of 8 against 530 with the planner's 128.
if wants 4 && [ -f "$AB/main/prefill_bench.xz" ]; then
  m=$AB/main/prefill_bench.xz
  for d in 128 256; do
    { echo "== launch orders d$d"
      PREFILL_AB_ARGS_grid="--prefill on --tile-band 0" PREFILL_AB_ARGS_band8="--prefill on --tile-band 8" \
        PREFILL_AB_ARGS_band16="--prefill on --tile-band 16" PREFILL_AB_ARGS_band32="--prefill on --tile-band 32" \
        ROUNDS=${ROUNDS:-3} PREFILL_AB_TESTS=0 \
        PREFILL_AB_ARGS="--formats bf16,fp8,nvfp4 --head-dim $d --shapes 16384,2048+30720,ragged8" \
        tools/prefill_ab.sh "$OUT/logs/orders_d$d" planner="$m" grid="$m" band8="$m" band16="$m" band32="$m"; } 2>&1 |
      tee "$OUT/ab_orders_d$d.txt"
  done
fi
# Part 5: the builds that change decode or the runs kernel, against main at
# the q_len table's shapes (tools/bench_ab.sh: rounds alternate the two).
runs_builds=(${RUNS_BUILDS:-})
if wants 5 && [ -f "$AB/main/metrale_bench.xz" ]; then
  bins=${PREFILL_AB_BINS:-/tmp/prefill_ab_bins}
  mkdir -p "$bins"
  [ -x "$bins/mb_main" ] || tools/unxz.sh "$AB/main/metrale_bench.xz" "$bins/mb_main"
  for n in "${runs_builds[@]}"; do
    [ -f "$AB/$n/metrale_bench.xz" ] || continue
    [ -x "$bins/mb_$n" ] || tools/unxz.sh "$AB/$n/metrale_bench.xz" "$bins/mb_$n"
    for q in 1 2 4 8; do
      { echo "== $n against main, q_len $q (B = $n)"
        BENCH_AB_WRITE=0 BENCH_ARGS="--formats bf16,fp8,nvfp4 --shapes 1x32768,16x8192,64x4096 --q-len $q" \
          tools/bench_ab.sh "$bins/mb_main" "$bins/mb_$n" "$OUT/logs/runs_${n}_q$q"; } 2>&1 |
        tee "$OUT/ab_runs_${n}_q$q.txt"
    done
  done
fi
# The device tool returns 8 files (session 20, call 1, lost its verification
# table): every table in one (suite_tables.txt, in the order the groups
# ran), the tables one by one with the logs (and ncu's per-instruction CSV,
# for tools/ncu_sass_stalls.py) in one archive.
(cd "$OUT" && { ls -tr ab_*.txt 2>/dev/null | xargs -r cat; } >suite_tables.txt && { mv ab_*.txt logs/ 2>/dev/null; true; } &&
  tar czf results.tgz logs && rm -rf logs)
