#!/bin/bash
# session 35: after chain1 - `one` (session 34, page-order snippets in training) on the demo test under the
# query-ordered snippets (the environment oneq is evaluated in), then RL from oneq (rlq.toml, 3 steps).
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s35
until grep -q "CHAIN1 DONE" $R/chain1.log; do sleep 20; done
date
$A eval $R/wq/test.jsonl --model runs/s34/one --search local:$R/wq/index.sqlite --config $R/q_eval.toml --compare runs/s34/one/demo-test.json -o $R/probe/one_q_demo.json --answers $R/probe/one_q_demo.parquet
date
$A run-all --config $R/rlq.toml --out $R/rlq
date
echo CHAIN2 DONE
