#!/bin/bash
# copy a run's reports (JSON, no tables or checkpoints), its log without progress bars, and the load log
# usage: collect.sh [RUN_DIR] [DEST] [LOG_DIR]  (LOG_DIR holds real.log and load.log; default runs/s42)
run=${1:-runs/s42/real}; dst=${2:-bench/learning_runs/s42}; logs=${3:-runs/s42}
mkdir -p "$dst/real"
(cd "$run" && find . -name "*.json" -not -path "*/ckpt/*" -not -path "./sft/*" -not -path "./world/*" \
   -not -path "./real/*" -not -path "*/.*" -print0 | xargs -0 -I{} cp --parents {} "$OLDPWD/$dst/real/")
[[ -f "$run/summary.md" ]] && cp "$run/summary.md" "$dst/real/"
tr '\r' '\n' < "$logs/real.log" | grep -av "it/s\]\|examples/s\]\|s/it\]" > "$dst/real.log"
cp "$logs/load.log" "$dst/load.log"
