#!/bin/bash
# session 44's runs into bench/learning_runs/s44/: each run's reports (session 42's collect.sh, fed its log and load
# log under the names it reads), the arms against session 43's chain (arms.py), the transfer reading counts and
# where the kept rows and the transfer answers quote from (positions.py)
set -euo pipefail
cd /work/main
dst=bench/learning_runs/s44 tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
collect() {  # RUN NAME LOG LOAD
    mkdir -p "$tmp/$2" && cp "$3" "$tmp/$2/real.log" && cp "$4" "$tmp/$2/load.log"
    bench/learning_runs/s42/collect.sh "$1" "$dst/$2" "$tmp/$2"
}
collect runs/s43/replay replay runs/s43/replay.log runs/s43/replay_load.log
pairs=(runs/s43/replay:rft-01=runs/s43/real:rft-01 runs/s43/replay:rft-01=runs/s43/real:sft)
tables=(runs/s43/real/eval/transfer/{sft,rft-01,rft-02}.parquet runs/s43/replay/eval/transfer/rft-01.parquet)
if [[ -f runs/s44/round3/eval/transfer/rft-03.json ]]; then
    collect runs/s44/round3 round3 runs/s44/round3.log runs/s44/load.log
    pairs+=(runs/s44/round3:rft-03=runs/s43/real:rft-02 runs/s44/round3:rft-03=runs/s43/real:sft)
    tables+=(runs/s44/round3/eval/transfer/rft-03.parquet)
    .venv/bin/python bench/learning_runs/s42/compare.py runs/s44/round3 > "$dst/compare_round3.txt"
fi
if [[ -f runs/s44/pq2/eval/transfer/rft-02.json ]]; then
    collect runs/s44/pq2 pq2 runs/s44/pq2.log runs/s44/pq2_load.log
    pairs+=(runs/s44/pq2:rft-02=runs/s43/real:rft-02 runs/s44/pq2:rft-02=runs/s43/real:sft)
    tables+=(runs/s44/pq2/eval/transfer/rft-02.parquet)
    .venv/bin/python bench/learning_runs/s42/compare.py runs/s44/pq2 > "$dst/compare_pq2.txt"
fi
.venv/bin/python bench/learning_runs/s44/arms.py "${pairs[@]}" > "$dst/arms.txt"
.venv/bin/python bench/real_docs/reading.py "${tables[@]}" > "$dst/reading.txt"
.venv/bin/python bench/real_docs/positions.py runs/s43/real/eval/transfer/{sft,rft-02}.parquet \
    runs/s43/real/rft/0{1,2}/kept.parquet > "$dst/positions.txt"
