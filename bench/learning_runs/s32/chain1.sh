#!/bin/bash
# session 32: the mix3 recipe (e1 + one epoch of every real row and the same 60 demo rows), with the real expert's
# contrastive reading (a rival sentence quoted before the answer's, and the question's words that only the answer's
# sentence has); then its transfer and demo evals, compared with mix3.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s32
date
$A sft $R/mix4_sft.parquet --model runs/s30/e1/sft --out $R/mix4 --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s30/e1/real/test.jsonl --model $R/mix4 --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare bench/learning_runs/s31/mix3/transfer.json -o $R/mix4/transfer.json --answers $R/mix4/transfer.parquet
date
$A eval runs/s30/w2/test.jsonl --model $R/mix4 --search local:runs/s30/w2/index.sqlite --config runs/s30/b_eval.toml --compare bench/learning_runs/s31/mix3/demo-test.json -o $R/mix4/demo-test.json --answers $R/mix4/demo-test.parquet
date
echo CHAIN1 DONE
