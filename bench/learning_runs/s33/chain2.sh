#!/bin/bash
# session 33: the enlarged SQLite test split (55 + 60 new questions on pages no training question uses).
# Baselines (top-3 passages, base model in the agent loop) on all 115; the best earlier agents and mix5 on the 60 new
# ones (their 55-question answers are the reports already written). Waits for chain1.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s33
while ! grep -q "CHAIN1 DONE" $R/chain1.log; do sleep 20; done
date
$A demo-world --real sqlite --out $R/real
.venv/bin/python -c "
import json
rows=[json.loads(l) for l in open('$R/real/test.jsonl')]
new=[r for r in rows if int(r['id'].rsplit('_',1)[1])>=600]
open('$R/real/new60.jsonl','w').write(''.join(json.dumps(r)+'\n' for r in new)); print(len(rows), len(new))"
mkdir -p $R/base
date
.venv/bin/python bench/real_docs/baseline.py --world $R/real --model smollm2 --out $R/base/top3.parquet
$A eval $R/base/top3.parquet -o $R/base/top3.json
date
for pair in mix:runs/s30/mix rl3:runs/s31/rl/steps/0003/ckpt mix4:runs/s32/mix4 mix5:$R/mix5; do
  name=${pair%%:*}; model=${pair#*:}
  $A eval $R/real/new60.jsonl --model $model --search local:$R/real/index.sqlite --config runs/s30/b_eval.toml -o $R/base/${name}_new60.json --answers $R/base/${name}_new60.parquet
  date
done
$A eval $R/real/test.jsonl --model smollm2 --search local:$R/real/index.sqlite --config examples/learn.toml -o $R/base/base.json --answers $R/base/base.parquet
date
echo CHAIN2 DONE
