#!/bin/bash
# session 33: session 31's `rl` run from the mix, a third seed (seed 2; 3 steps, evals at the end, transfer on all
# 115 test questions), and the seed-1 run's step 3 on the 60 new test questions. Waits for the suite.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s33
while ! grep -q "SUITE DONE" $R/suite.log; do sleep 20; done
date
$A eval $R/real/new60.jsonl --model runs/s31/rl_s1/steps/0003/ckpt --search local:$R/real/index.sqlite --config runs/s30/b_eval.toml -o $R/base/rl_s1_new60.json --answers $R/base/rl_s1_new60.parquet
date
$A run-all --config $R/rl_s2_full.toml --out $R/rl_s2
date
echo CHAIN3 DONE
