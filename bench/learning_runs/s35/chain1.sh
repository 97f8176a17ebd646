#!/bin/bash
# session 35: `one`'s SFT recipe on the world whose snippets put the sentences with the most query words first
# (demo-world --snippets query), then its transfer (115) and demo test evals under the same snippet order.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s35
date
$A sft $R/wq/sft.parquet --model smollm2 --out $R/oneq --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s34/real/test.jsonl --model $R/oneq --search local:runs/s34/real/index.sqlite --config $R/q_eval.toml --compare $R/probe/one_q.json -o $R/oneq/transfer.json --answers $R/oneq/transfer.parquet
date
$A eval $R/wq/test.jsonl --model $R/oneq --search local:$R/wq/index.sqlite --config $R/q_eval.toml --compare runs/s34/one/demo-test.json -o $R/oneq/demo-test.json --answers $R/oneq/demo-test.parquet
date
echo CHAIN1 DONE
