#!/bin/bash
# session 34: one epoch from the base model over the whole stepwise-real SFT set (200 demo + 403 real rows, the cut
# quotes), replacing the two-stage e1 + mix recipe; then its transfer (115) and demo test evals.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s34
B=bench/learning_runs
date
$A sft $R/w/sft.parquet --model smollm2 --out $R/one --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval $R/real/test.jsonl --model $R/one --search local:$R/real/index.sqlite --config runs/s30/b_eval.toml --compare $B/s33/test115/mix_all.json -o $R/one/transfer.json --answers $R/one/transfer.parquet
date
$A eval $R/w/test.jsonl --model $R/one --search local:$R/w/index.sqlite --config runs/s30/b_eval.toml --compare $B/s30/mix/demo-test.json -o $R/one/demo-test.json --answers $R/one/demo-test.parquet
date
echo CHAIN1 DONE
