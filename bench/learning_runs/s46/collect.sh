#!/bin/bash
# session 46's runs into bench/learning_runs/s46/: the seed-1 run (bench/learning_runs/s45/seed1.sh) whole, its
# SFT and round 1's rollout from session 45's launches and round 1's tune, round 2 and their evals from session 46's
# resumed launch (logs joined in order); the soups (soup.sh) and run-all's own soup (soup_resume.sh); paired intervals (arms.py), the baselines check (compare.py) and the reading counts
set -euo pipefail
cd "$(dirname "$0")/../../.."
dst=bench/learning_runs/s46 tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
strip() { tr '\r' '\n' < "$1" | grep -av "it/s\]\|examples/s\]\|s/it\]\|ETA"; }  # a log without progress bars
mkdir -p "$tmp/seed1"
cat runs/s45/s45.log runs/s45b/s45b.log runs/s45r/s45r.log runs/s46/s46.log > "$tmp/seed1/real.log"
cat runs/s45/s45_load.log runs/s45b/s45b_load.log runs/s45r/s45r_load.log runs/s46/s46_load.log > "$tmp/seed1/load.log"
bench/learning_runs/s42/collect.sh runs/s45/real1 "$dst/seed1" "$tmp/seed1"
.venv/bin/python bench/learning_runs/s42/compare.py runs/s45/real1 > "$dst/compare_seed1.txt"
pairs=(runs/s45/real1:sft=runs/s43/real:sft)
tables=(runs/s43/real/eval/transfer/sft.parquet runs/s45/real1/eval/transfer/sft.parquet)
for r in 01 02; do
    if [[ -f runs/s45/real1/eval/transfer/rft-$r.json ]]; then
        pairs+=(runs/s45/real1:rft-$r=runs/s45/real1:sft runs/s45/real1:rft-$r=runs/s43/real:rft-$r)
        tables+=(runs/s45/real1/eval/transfer/rft-$r.parquet)
    fi
done
[[ -f runs/s45/real1/eval/transfer/rft-02.json ]] && pairs+=(runs/s45/real1:rft-02=runs/s45/real1:rft-01)
for d in runs/s46/soups/*/; do
    n=$(basename "$d")
    [[ -f $d/eval/transfer/$n.json && -f $d/eval/$n.json ]] || continue
    mkdir -p "$dst/soups/$n/eval/transfer"
    cp "$d/eval/$n.json" "$dst/soups/$n/eval/"
    cp "$d/eval/transfer/$n.json" "$dst/soups/$n/eval/transfer/"
    cp "$d/ckpt/atom_state.json" "$dst/soups/$n/"
    .venv/bin/python bench/learning_runs/s42/compare.py "$d" > "$dst/compare_soup_$n.txt"
    pairs+=(runs/s46/soups/$n:$n=runs/s43/real:sft runs/s46/soups/$n:$n=runs/s43/real:rft-02)
    [[ $n == s01* ]] && pairs+=(runs/s46/soups/$n:$n=runs/s45/real1:rft-02)
    [[ $n == s1* ]] && pairs+=(runs/s46/soups/$n:$n=runs/s45/real1:sft runs/s46/soups/$n:$n=runs/s45/real1:rft-02)
    tables+=($d/eval/transfer/$n.parquet)
done
for n in s46soup s46soup2; do  # soup.sh's launches: the three soups, then seed 1's
    [[ -f runs/s46/$n.log ]] || continue
    strip runs/s46/$n.log > "$dst/soups/$n.log"
    cp runs/s46/${n}_load.log "$dst/soups/${n}_load.log"
done
if [[ -f runs/s46/real1soup/eval/transfer/rft-soup.json ]]; then  # soup_resume.sh: run-all's own rft_soup path
    mkdir -p "$dst/real1soup/eval/transfer"
    cp runs/s46/real1soup/eval/rft-soup.json "$dst/real1soup/eval/"
    cp runs/s46/real1soup/eval/transfer/rft-soup.json "$dst/real1soup/eval/transfer/"
    cp runs/s46/real1soup/rft/soup/ckpt/atom_state.json runs/s46/real1soup/summary.md "$dst/real1soup/"
    for n in s46rs s46rs2; do
        strip runs/s46/$n.log > "$dst/real1soup/$n.log"
    done
    cp runs/s46/s46rs2_load.log "$dst/real1soup/load.log"
    .venv/bin/python bench/learning_runs/s42/compare.py runs/s46/real1soup > "$dst/compare_real1soup.txt"
fi
.venv/bin/python bench/learning_runs/s44/arms.py "${pairs[@]}" > "$dst/arms.txt"
.venv/bin/python bench/real_docs/reading.py "${tables[@]}" > "$dst/reading.txt"
