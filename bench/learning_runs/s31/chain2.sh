#!/bin/bash
# session 31: after chain1: the transfer eval of the RL run's step 3; then the same RL (curriculum "sources", 6 steps)
# from mix3 on the w3 world (484 real train questions), evals only at the end.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s31
while ! grep -q "CHAIN1 DONE" $R/chain1.log; do sleep 20; done
date
$A eval runs/s30/e1/real/test.jsonl --model $R/rl/steps/0003/ckpt --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare bench/learning_runs/s30/mix/transfer.json -o $R/rl/transfer-step-0003.json --answers $R/rl/transfer-step-0003.parquet
date
$A run-all --config $R/rl3_full.toml --out $R/rl3 > $R/rl3.log 2>&1
date
echo CHAIN2 DONE
