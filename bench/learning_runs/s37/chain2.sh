#!/bin/bash
# session 37: oneq's SFT command on the stepwise-real rows with the rival pair in random order (the answer's
# sentence first or second), plus a second copy (wording seed 1) of every real row that searches twice or browses
# (bench/real_docs/multistep.py), then the transfer eval and the demo test eval.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
# 2 MB pages for large CPU tensors: without it this run spent more time in page faults than in compute (session 37)
export THP_MEM_ALLOC_ENABLE=1
# and keep freed memory in the process: 90% of the time went to the kernel zeroing pages handed back and
# taken again (perf: clear_page_erms); glibc then never returns heap memory to the system
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
A=.venv/bin/atom
R=runs/s37
P=runs/s35
Q=bench/learning_runs/s37/q_eval.toml
date
$A sft $R/wrm/sft.parquet --model smollm2 --out $R/onerm --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s34/real/test.jsonl --model $R/onerm --search local:runs/s34/real/index.sqlite --config $Q --compare $P/oneq/transfer.json -o $R/onerm/transfer.json --answers $R/onerm/transfer.parquet
date
$A eval $P/wq/test.jsonl --model $R/onerm --search local:$P/wq/index.sqlite --config $Q --compare $P/oneq/demo-test.json -o $R/onerm/demo-test.json --answers $R/onerm/demo-test.parquet
date
echo CHAIN2 DONE
