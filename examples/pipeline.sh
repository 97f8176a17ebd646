#!/usr/bin/env bash
# One GRPO step of the recipe as a shell pipeline of single stages, JSONL in, Parquet between.
# Runs offline on the embedded demo world:  bash examples/pipeline.sh [WORK_DIR]
set -euo pipefail
W=${1:-runs/pipeline}
export HF_HUB_OFFLINE=1
mkdir -p "$W"
[ -f "$W/world/index.sqlite" ] || atom demo-world --out "$W/world"
MODEL=${MODEL:-smollm2}
INDEX="local:$W/world/index.sqlite"

# questions as JSONL on stdin -> rollouts -> RRM scores -> rewards, all through pipes
head -n 4 "$W/world/train.jsonl" \
  | atom rollout - --model "$MODEL" --search "$INDEX" --group-size 4 --max-turns 4 --max-new-tokens 160 --k 3 --out - \
  | atom score-rrm - --judge heuristic --out - \
  | atom aggregate-reward - --step 0 --total-steps 10 --out "$W/rewarded.parquet"

atom grpo-step "$W/rewarded.parquet" --model "$MODEL" --lr 1e-5 --beta 0 --out "$W/ckpt-1"
atom show "$W/rewarded.parquet" --row 0 --html "$W/trajectory.html"
atom eval "$W/rewarded.parquet" --out - | head -c 400; echo
