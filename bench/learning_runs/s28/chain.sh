#!/bin/bash
# session 28: evals of the quote SFT, the mixed epoch from it, its evals. One model job at a time.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s28
while pgrep -f "atom run-all" >/dev/null; do sleep 20; done
mkdir -p $R/ev
date
$A eval $R/sq/real/test.jsonl --model $R/sq/sft --search local:$R/sq/real/index.sqlite --config $R/b_eval.toml \
  --compare bench/learning_runs/baselines/top3.json -o $R/ev/sq_transfer.json --answers $R/ev/sq_transfer.parquet
date
$A eval $R/sq/world/test.jsonl --model $R/sq/sft --search local:$R/sq/world/index.sqlite --config $R/b_eval.toml \
  -o $R/ev/sq_demo.json --answers $R/ev/sq_demo.parquet
date
.venv/bin/python - <<'PY'
import pyarrow.parquet as pq, pyarrow as pa, random
t = pq.read_table("runs/s28/sq/world/sft.parquet")
src = t.column("data_source").to_pylist()
real = [i for i,s in enumerate(src) if s.startswith("sqlite")]
demo = [i for i,s in enumerate(src) if not s.startswith("sqlite")]
pick = sorted(real + random.Random(0).sample(demo, len(real)))
pq.write_table(t.take(pa.array(pick)).replace_schema_metadata(t.schema.metadata), "runs/s28/mix_sft.parquet")
print("mix rows", len(pick), "real", len(real))
PY
date
$A sft $R/mix_sft.parquet --model $R/sq/sft --lr 1e-4 --warmup-ratio 0.1 --batch-size 4 --epochs 1 --precision bf16 \
  --no-gradient-checkpointing --sampling length --out $R/mix
date
$A eval $R/sq/real/test.jsonl --model $R/mix --search local:$R/sq/real/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/sq_transfer.json -o $R/ev/mix_transfer.json --answers $R/ev/mix_transfer.parquet
date
$A eval $R/sq/world/test.jsonl --model $R/mix --search local:$R/sq/world/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/sq_demo.json -o $R/ev/mix_demo.json --answers $R/ev/mix_demo.parquet
date
echo CHAIN DONE
