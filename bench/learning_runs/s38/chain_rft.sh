#!/usr/bin/env bash
# Session 38: rejection-sampling fine-tuning from oneq seed 1 on the real training questions (issue 20).
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
while pgrep -f "run-all --demo --preset learn" >/dev/null; do sleep 20; done
A=.venv/bin/atom; R=runs/s38/rft; BASE=runs/s36/oneq_s1; CFG=bench/learning_runs/s37/q_eval.toml
echo "rollout start $(date +%H:%M:%S)"
$A rollout runs/s34/real/train.jsonl --model $BASE --search local:runs/s34/real/index.sqlite --config $CFG \
   --group-size 2 --seed 0 -o $R/roll.parquet || exit 1
echo "filter $(date +%H:%M:%S)"
.venv/bin/atom rft $R/roll.parquet -o $R/sft.parquet || exit 1
echo "sft start $(date +%H:%M:%S)"
$A sft $R/sft.parquet --model $BASE --out $R/ckpt --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 \
   --epochs 1 --precision bf16 --no-gradient-checkpointing --seed 0 || exit 1
echo "eval start $(date +%H:%M:%S)"
$A eval runs/s34/real/test.jsonl --model $R/ckpt --search local:runs/s34/real/index.sqlite --config $CFG \
   --compare $BASE/transfer.json -o $R/transfer.json --answers $R/transfer.parquet
echo "end $(date +%H:%M:%S)"
