#!/bin/bash
# session 43's run into bench/learning_runs/s43/: its reports, log and load log (session 42's collect.sh), then the
# paired intervals (session 42's compare.py) and the reading counts of both sessions' transfer tables
set -euo pipefail
cd /work/main
run=runs/s43/real dst=bench/learning_runs/s43
bench/learning_runs/s42/collect.sh "$run" "$dst" runs/s43
.venv/bin/python bench/learning_runs/s42/compare.py "$run" > "$dst/compare.txt"
.venv/bin/python bench/real_docs/reading.py runs/s42/real/eval/transfer/{sft,rft-01,rft-02}.parquet \
    $run/eval/transfer/rft-0*.parquet > "$dst/reading.txt"
