#!/bin/bash
# session 31: after chain2: does RL from the mix replicate with another seed? The rl run's settings, seed 1, 3 steps,
# demo and transfer evals at the end; then the full test suite.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s31
while ! grep -q "CHAIN2 DONE" $R/chain2.log; do sleep 20; done
date
$A run-all --config $R/rl_s1_full.toml --out $R/rl_s1 > $R/rl_s1.log 2>&1
date
.venv/bin/python -m pytest -q > $R/ci.log 2>&1; echo "pytest rc $?"
date
echo CHAIN3 DONE
