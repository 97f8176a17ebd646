#!/bin/bash
# copy session 43's run reports (JSON, no tables or checkpoints), its log without progress bars and the load log
# into bench/learning_runs/s43/; then the paired intervals (compare.py of session 42) and the reading counts
set -euo pipefail
cd /work/main
run=runs/s43/real dst=bench/learning_runs/s43
mkdir -p "$dst/real"
(cd "$run" && find . -name "*.json" -not -path "*/ckpt/*" -not -path "./sft/*" -not -path "./world/*" \
   -not -path "./real/*" -not -path "*/.*" -print0 | xargs -0 -I{} cp --parents {} "$OLDPWD/$dst/real/")
[[ -f "$run/summary.md" ]] && cp "$run/summary.md" "$dst/real/"
tr '\r' '\n' < runs/s43/real.log | grep -av "it/s\]\|examples/s\]\|s/it\]" > "$dst/real.log"
cp runs/s43/load.log "$dst/load.log"
.venv/bin/python bench/learning_runs/s42/compare.py "$run" > "$dst/compare.txt"
.venv/bin/python bench/real_docs/reading.py runs/s42/real/eval/transfer/{sft,rft-01,rft-02}.parquet \
    $run/eval/transfer/rft-0*.parquet > "$dst/reading.txt"
