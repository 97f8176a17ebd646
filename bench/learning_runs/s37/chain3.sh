#!/bin/bash
# session 37: after chain2's transfer eval (its demo test eval is stopped: no time in the session), the heap
# benchmark, then oneq's SFT command on the world with the rival order change alone (runs/s37/wr: which of
# chain2's two changes moved transfer) and its transfer eval.
set -x
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
A=.venv/bin/atom
R=runs/s37
P=runs/s35
Q=bench/learning_runs/s37/q_eval.toml
until [ -s $R/onerm/transfer.json ]; do sleep 10; done
pkill -f chain2.sh; pkill -f "atom eval"; sleep 5
date
.venv/bin/python bench/heap.py --rounds 1 --steps 3 > $R/heap_bench.md
date
# atom sets the heap policy itself now (atomcli/heap.py): no MALLOC_* variables here
$A sft $R/wr/sft.parquet --model smollm2 --out $R/oner --lr 2e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 --precision bf16 --no-gradient-checkpointing --sampling length
date
$A eval runs/s34/real/test.jsonl --model $R/oner --search local:runs/s34/real/index.sqlite --config $Q --compare $P/oneq/transfer.json -o $R/oner/transfer.json --answers $R/oner/transfer.parquet
date
echo CHAIN3 DONE
