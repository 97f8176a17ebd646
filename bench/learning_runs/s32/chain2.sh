#!/bin/bash
# session 32: RL from mix4 with 8 questions a step (2 of each data_source), 4 steps, the s31 rl run's settings
# otherwise; the step-2 checkpoint's transfer eval after it. Waits for the test suite (go2).
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s32
while ! grep -q "CHAIN1 DONE" $R/chain1.log || [ ! -e $R/go2 ]; do sleep 20; done
date
$A run-all --config $R/rl8_full.toml --out $R/rl8
date
$A eval runs/s30/e1/real/test.jsonl --model $R/rl8/steps/0002/ckpt --search local:runs/s30/e1/real/index.sqlite --config runs/s30/b_eval.toml --compare $R/mix4/transfer.json -o $R/rl8/transfer-step-0002.json --answers $R/rl8/transfer-step-0002.parquet
date
echo CHAIN2 DONE
