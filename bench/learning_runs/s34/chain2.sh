#!/bin/bash
# session 34: the one-epoch SFT again with every real row's search results, and the sentences of each snippet, in a seeded random order (p = 1), the
# same rows, lengths and batches otherwise; then its transfer (115) and demo test evals, compared with `one`.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s34
while ! grep -q "CHAIN1 DONE" $R/chain1.log; do sleep 20; done
date
.venv/bin/python bench/real_docs/shuffle_results.py $R/w/sft.parquet $R/shuf_sft.parquet --p 1 --sentences
$A sft $R/shuf_sft.parquet --model smollm2 --out $R/shuf --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval $R/real/test.jsonl --model $R/shuf --search local:$R/real/index.sqlite --config runs/s30/b_eval.toml --compare $R/one/transfer.json -o $R/shuf/transfer.json --answers $R/shuf/transfer.parquet
date
$A eval $R/w/test.jsonl --model $R/shuf --search local:$R/w/index.sqlite --config runs/s30/b_eval.toml --compare $R/one/demo-test.json -o $R/shuf/demo-test.json --answers $R/shuf/demo-test.parquet
date
echo CHAIN2 DONE
