#!/bin/bash
# session 33: the mix4 recipe (e1 + one epoch of every real row and the same 60 demo rows, mix4's order) with the
# real expert's quotes cut just after the answer; then its transfer, train110 and demo evals, compared with mix4.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s33
date
$A sft $R/mix5_sft.parquet --model runs/s30/e1/sft --out $R/mix5 --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s30/e1/real/test.jsonl --model $R/mix5 --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare runs/s32/mix4/transfer.json -o $R/mix5/transfer.json --answers $R/mix5/transfer.parquet
date
$A eval runs/s32/train110.jsonl --model $R/mix5 --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare runs/s32/mix4/train110.json -o $R/mix5/train110.json --answers $R/mix5/train110.parquet
date
$A eval runs/s30/w2/test.jsonl --model $R/mix5 --search local:runs/s30/w2/index.sqlite --config runs/s30/b_eval.toml --compare runs/s32/mix4/demo-test.json -o $R/mix5/demo-test.json --answers $R/mix5/demo-test.parquet
date
echo CHAIN1 DONE
