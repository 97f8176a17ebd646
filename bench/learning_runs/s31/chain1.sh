#!/bin/bash
# session 31: after the RL run, the s30 mix recipe from e1 with the 403 real rows (s30: 303) + the same 60 demo rows;
# then its transfer and demo evals.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s31
while pgrep -f "run-all --config runs/s31/rl_full.toml" >/dev/null; do sleep 20; done
date
$A sft $R/mix3_sft.parquet --model runs/s30/e1/sft --out $R/mix3 --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s30/e1/real/test.jsonl --model $R/mix3 --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare bench/learning_runs/s30/mix/transfer.json -o $R/mix3/transfer.json --answers $R/mix3/transfer.parquet
date
$A eval runs/s30/w2/test.jsonl --model $R/mix3 --search local:runs/s30/w2/index.sqlite --config runs/s30/b_eval.toml --compare bench/learning_runs/s30/mix/demo-test.json -o $R/mix3/demo-test.json --answers $R/mix3/demo-test.parquet
date
echo CHAIN1 DONE
