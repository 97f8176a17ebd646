#!/bin/bash
# session 36: after chain2 - oneq's SFT again with seed 1 (is 0.228 the recipe or the draw?), then its transfer eval
# and, if the session leaves time, its demo test eval.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s36
P=runs/s35
until grep -q "CHAIN2 DONE" $R/chain2.log; do sleep 10; done
date
$A sft $P/wq/sft.parquet --model smollm2 --out $R/oneq_s1 --seed 1 --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s34/real/test.jsonl --model $R/oneq_s1 --search local:runs/s34/real/index.sqlite --config $R/q_eval.toml --compare $P/oneq/transfer.json -o $R/oneq_s1/transfer.json --answers $R/oneq_s1/transfer.parquet
date
$A eval $P/wq/test.jsonl --model $R/oneq_s1 --search local:$P/wq/index.sqlite --config $R/q_eval.toml --compare $P/oneq/demo-test.json -o $R/oneq_s1/demo-test.json --answers $R/oneq_s1/demo-test.parquet
date
echo CHAIN3 DONE
