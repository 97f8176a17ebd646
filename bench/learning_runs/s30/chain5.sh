#!/bin/bash
# session 30: a second epoch of the same mix (303 real + 60 demo rows, another shuffle) from the first epoch's
# checkpoint, then its transfer eval (no demo eval: the session's time). Waits for chain4.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s30
while ! grep -q "CHAIN4 DONE" $R/chain4.log; do sleep 20; done
date
$A sft $R/mix_sft.parquet --model $R/mix --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 \
  --precision bf16 --no-gradient-checkpointing --sampling length --seed 1 --out $R/mix2 > $R/mix2.log 2>&1
date
$A eval $R/e1/real/test.jsonl --model $R/mix2 --search local:$R/e1/real/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/mix_transfer.json -o $R/ev/mix2_transfer.json --answers $R/ev/mix2_transfer.parquet
date
echo CHAIN5 DONE
