#!/bin/bash
# session 34: after shuf's transfer eval, stop chain2 (its demo eval), run the full suite alone, then the demo eval.
cd /work/main
export HF_HUB_OFFLINE=1
R=runs/s34
while ! grep -q "wrote runs/s34/shuf/transfer.json" $R/chain2.log; do sleep 10; done
pkill -f chain2.sh; pkill -f "shuf/demo-test"; sleep 3
date; echo SUITE START
.venv/bin/python -m pytest -q -p no:cacheprovider > $R/suite.log 2>&1; echo "suite rc $?"
date; tail -3 $R/suite.log
.venv/bin/atom eval $R/w/test.jsonl --model $R/shuf --search local:$R/w/index.sqlite --config runs/s30/b_eval.toml --compare $R/one/demo-test.json -o $R/shuf/demo-test.json --answers $R/shuf/demo-test.parquet
date
echo CHAIN3 DONE
