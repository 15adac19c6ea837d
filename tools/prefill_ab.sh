#!/usr/bin/env bash
# Before/after timing of several prefill_bench binaries in one device call:
# ROUNDS rounds (default 2), the binaries in turn within each round, so that
# clock and thermal drift fall on all; then, per (format, shape), the best
# TFLOPS of each binary and its ratio to the first.
#
#   tools/prefill_ab.sh OUT_DIR NAME=BINARY [NAME=BINARY ...]
#   (a BINARY ending in .xz is unpacked first, into PREFILL_AB_BINS, default
#   /tmp/prefill_ab_bins: outside OUT_DIR, whose files travel back)
#   PREFILL_AB_ARGS   options for every binary (default: the d128 shapes)
#   PREFILL_AB_ARGS_<NAME>  more options for that one (e.g. --load-path registers)
#   PREFILL_AB_TESTS=1  first runs each binary's sibling test_gpu_attn(.xz), if there
#                       is one (GTEST_FILTER, default every test; METRALE_GPU_TEST_ITERS;
#                       TEST_TIMEOUT, 150 s); BENCH_TIMEOUT (60 s; a bench run takes 3-15 s) bounds each bench run
# The binaries come from tools/build_prefill_variants.sh (one per branch).
set -uo pipefail
# Stopped from outside (an outer timeout), stop the binary in flight too: in
# session 16 a hung knockout outlived its killed caller and shared the GPU
# with the next run.
trap 'pkill -TERM -P $$; exit 143' TERM INT
OUT=$1
shift
mkdir -p "$OUT"
args=${PREFILL_AB_ARGS:---head-dim 128}
unpack() {  # NAME BINARY -> the runnable path
  case $2 in
    *.xz)
      local to="${PREFILL_AB_BINS:-/tmp/prefill_ab_bins}/$1"
      mkdir -p "$(dirname "$to")"
      [ -x "$to" ] || "$(dirname "$0")/unxz.sh" "$2" "$to"
      echo "$to" ;;
    *) echo "$2" ;;
  esac
}
bins=()
for nb in "$@"; do bins+=("${nb%%=*}=$(unpack "${nb%%=*}" "${nb#*=}")"); done
if [ "${PREFILL_AB_TESTS:-0}" = 1 ]; then
  for nb in "$@"; do
    name=${nb%%=*} dir=$(dirname "${nb#*=}")
    t=$(ls "$dir"/test_gpu_attn.xz "$dir"/test_gpu_attn 2>/dev/null | head -1)
    [ -n "$t" ] || continue
    tb=$(unpack "test_$name" "$t")
    timeout "${TEST_TIMEOUT:-150}" "$tb" --gtest_brief=1 ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} \
      >"$OUT/test_$name.log" 2>&1
    echo "test_gpu_attn $name: rc $? $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_$name.log" | tr '\n' ' ')"
  done
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  for nb in "${bins[@]}"; do
    name=${nb%%=*} bin=${nb#*=}
    extra_var="PREFILL_AB_ARGS_$name"
    # a variant that hangs costs BENCH_TIMEOUT seconds, not the call (in the
    # background and waited for, so that the trap above runs at once)
    timeout "${BENCH_TIMEOUT:-60}" "$bin" $args ${!extra_var:-} --json "$OUT/${name}_$r.json" \
      >"$OUT/${name}_$r.log" 2>&1 &
    wait $! || echo "$name round $r: rc $?"
  done
done
python3 - "$OUT" "$@" <<'PY'
import glob, json, os, sys
out, names = sys.argv[1], [a.split("=", 1)[0] for a in sys.argv[2:]]
best = {}
for n in names:
    for p in sorted(glob.glob(os.path.join(out, f"{n}_*.json"))):
        for r in json.load(open(p))["rows"]:
            k = (r["format"], r["shape"])
            best.setdefault(n, {})[k] = max(best.get(n, {}).get(k, 0.0), r["tflops"])
keys = list(best.get(names[0], {}))
print(f"{'format':<7}{'shape':<16}" + "".join(f"{n[:18]:>20}" for n in names))
for k in keys:
    base = best[names[0]][k]
    cells = [f"{best[n].get(k, float('nan')):8.1f} ({best[n].get(k, float('nan')) / base:4.2f})" for n in names]
    print(f"{k[0]:<7}{k[1]:<16}" + "".join(f"{c:>20}" for c in cells))
PY
