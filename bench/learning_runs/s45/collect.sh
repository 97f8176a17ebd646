#!/bin/bash
# session 45's runs into bench/learning_runs/s45/: the seed-1 run's reports (session 42's collect.sh; its log is the
# first launch's and each resumed launch's, joined), the contrast arm's reports and update metrics, the arms against
# session 43's chain and the seed-0 SFT (arms.py), the baselines check (compare.py) and the reading counts
set -euo pipefail
cd "$(dirname "$0")/../../.."
dst=bench/learning_runs/s45 tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/seed1"
cat runs/s45/s45.log runs/s45b/s45b.log $(ls runs/s45r/s45r.log 2>/dev/null) > "$tmp/seed1/real.log"
cat runs/s45/s45_load.log runs/s45b/s45b_load.log $(ls runs/s45r/s45r_load.log 2>/dev/null) > "$tmp/seed1/load.log"
bench/learning_runs/s42/collect.sh runs/s45/real1 "$dst/seed1" "$tmp/seed1"
.venv/bin/python bench/learning_runs/s42/compare.py runs/s45/real1 > "$dst/compare_seed1.txt"
.venv/bin/python bench/learning_runs/s42/compare.py runs/s45/contrast > "$dst/compare_contrast.txt"
mkdir -p "$dst/contrast/eval/transfer"
cp runs/s45/contrast/updates.jsonl "$dst/contrast/"
cp runs/s45/contrast/eval/contrast.json "$dst/contrast/eval/"
cp runs/s45/contrast/eval/transfer/contrast.json "$dst/contrast/eval/transfer/"
tr '\r' '\n' < runs/s45/s45c2.log | grep -av "it/s\]\|examples/s\]\|s/it\]\|ETA" > "$dst/contrast/contrast.log"
cp runs/s45/s45c2_load.log "$dst/contrast/load.log"
pairs=(runs/s45/contrast:contrast=runs/s43/real:sft runs/s45/contrast:contrast=runs/s43/real:rft-01
       runs/s45/real1:sft=runs/s43/real:sft)
tables=(runs/s43/real/eval/transfer/sft.parquet runs/s45/contrast/eval/transfer/contrast.parquet
        runs/s45/real1/eval/transfer/sft.parquet)
for r in 01 02; do
    if [[ -f runs/s45/real1/eval/transfer/rft-$r.json ]]; then
        pairs+=(runs/s45/real1:rft-$r=runs/s45/real1:sft runs/s45/real1:rft-$r=runs/s43/real:rft-$r)
        tables+=(runs/s45/real1/eval/transfer/rft-$r.parquet)
    fi
done
.venv/bin/python bench/learning_runs/s44/arms.py "${pairs[@]}" > "$dst/arms.txt"
.venv/bin/python bench/real_docs/reading.py "${tables[@]}" > "$dst/reading.txt"
