#!/usr/bin/env bash
# Run every side-by-side benchmark at small CPU sizes (a few minutes on 2 cores), one after
# another, each printing its ratios. Outputs go to $OUT/<name>.txt (default /tmp/atomcli-bench) and the terminal;
# plots to bench/plots/. Environment:
#   THREADS=1    torch threads for every benchmark (1 is the fair setting on a shared machine)
#   MODEL=smollm2  policy for rollout/grpo/MFU comparisons (tiny = random, fastest)
#   BIG=1        the full sizes (100k-row tables, 100k-document search, more repeats)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
THREADS=${THREADS:-1}
MODEL=${MODEL:-smollm2}
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$THREADS
OUT=${OUT:-/tmp/atomcli-bench}
mkdir -p "$OUT" bench/plots

if [[ -n "${BIG:-}" ]]; then
  SEARCH=(--sizes 10000,100000 --queries 300); TABLE=(--sizes 1000,100000 --stage-at-big); REP=3
else
  SEARCH=(--sizes 10000 --kinds english --queries 200); TABLE=(--sizes 1000,10000); REP=1
fi

run() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" >&2
  { echo "# $(date -u +%FT%TZ)  load: $(cut -d' ' -f1-3 /proc/loadavg)  threads: $THREADS"; "$@"; } \
    2> >(grep -v -e '^Loading weights' -e '^Writing model' >&2) | tee "$OUT/$name.txt"
}

run cli        "$PY" bench/bench_cli.py --repeats 10
run search     "$PY" bench/bench_search.py "${SEARCH[@]}"
run cache      "$PY" bench/bench_cache.py
run tableio    "$PY" bench/bench_tableio.py "${TABLE[@]}"
run rollout    "$PY" bench/bench_rollout.py --model "$MODEL" --questions 1 --group-size 8 --max-new-tokens 64 \
                   --max-turns 3 --repeats "$REP" --threads "$THREADS"
run rollout_trl "$PY" bench/bench_rollout_trl.py --model "$MODEL" --questions 1 --group-size 4 --max-new-tokens 32 \
                   --repeats $((REP + 2)) --threads "$THREADS"
run grpo       "$PY" bench/bench_grpo.py --model tiny --repeats $((REP + 1)) --steps 2 --threads "$THREADS"
run mfu        "$PY" bench/bench_mfu.py --model "$MODEL" --threads "$THREADS"
run scaling    "$PY" bench/bench_scaling.py --threads "$THREADS" --repeats 2
