#!/bin/bash
# session 36: after chain1 - `oneqa`: oneq's SFT recipe exactly, on the world whose real rows name the answer beside
# the question's word (runs/s36/wa, built with the session-36 expert: atom demo-world --style stepwise-real
# --snippets query), then its transfer and demo test evals against oneq, then the affected test files.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s36
P=runs/s35
# (chain1, the seed-1 oneq SFT, was stopped at step 9 so this runs first)
date
$A sft $R/wa/sft.parquet --model smollm2 --out $R/oneqa --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s34/real/test.jsonl --model $R/oneqa --search local:runs/s34/real/index.sqlite --config $R/q_eval.toml --compare $P/oneq/transfer.json -o $R/oneqa/transfer.json --answers $R/oneqa/transfer.parquet
date
$A eval $R/wa/test.jsonl --model $R/oneqa --search local:$R/wa/index.sqlite --config $R/q_eval.toml --compare $P/oneq/demo-test.json -o $R/oneqa/demo-test.json --answers $R/oneqa/demo-test.parquet
date
echo CHAIN2 DONE
