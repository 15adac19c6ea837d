#!/usr/bin/env bash
# Session 23, call 3: head_dim parts (NVFP4) at head_dim 256 (q_len 2 / 4 / 8)
# and at 128 with 4 n-tiles (q_len 8), against the planner's kernels of
# HEAD (its binary, .deps/ab/head, plain arguments), two alternated rounds.
set -u
B=.deps/build
A=.deps/ab/head
for z in $B/bench/metrale_bench.xz $A/metrale_bench.xz; do tools/unxz.sh "$z" "${z%.xz}"; done
S=1x32768,16x8192,64x4096
for r in 1 2; do
  $B/bench/metrale_bench --formats nvfp4 --head-dim 256 --shapes $S --q-len 1 --csv "$OUT/d256_q1_$r.csv" >"$OUT/d256_q1_$r.log" 2>&1
  for q in 2 4 8; do
    $A/metrale_bench --formats nvfp4 --head-dim 256 --shapes $S --q-len $q \
      --csv "$OUT/d256_q${q}_plan_$r.csv" >"$OUT/d256_q${q}_plan_$r.log" 2>&1
    $B/bench/metrale_bench --formats nvfp4 --head-dim 256 --shapes $S --q-len $q --col-tiles 2 --head-dim-parts 2 \
      --csv "$OUT/d256_q${q}_hp_$r.csv" >"$OUT/d256_q${q}_hp_$r.log" 2>&1
  done
  $A/metrale_bench --formats nvfp4 --shapes $S --q-len 8 --csv "$OUT/d128_q8_plan_$r.csv" >"$OUT/d128_q8_plan_$r.log" 2>&1
  $B/bench/metrale_bench --formats nvfp4 --shapes $S --q-len 8 --col-tiles 4 --head-dim-parts 2 \
    --csv "$OUT/d128_q8_hp4_$r.csv" >"$OUT/d128_q8_hp4_$r.log" 2>&1
done
for f in "$OUT"/*_2.log; do echo "== $(basename $f)"; grep -h "nvfp4" "$f" | cut -c1-150; done
tar czf "$OUT/call3.tgz" -C "$OUT" $(cd "$OUT" && ls *.csv *.log)
