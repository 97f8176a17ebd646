#!/bin/bash
# session 30: from the better SFT on transfer (e1 or e3), one epoch of every real-text SFT row of its expert (303) +
# 60 demo rows; batches of 2 with 2 accumulation steps (the same update as batches of 4, less memory and padding);
# then its transfer and demo evals. Waits for chain3.
set -x
cd /work/main
export HF_HUB_OFFLINE=1
A=.venv/bin/atom
R=runs/s30
while ! grep -q "CHAIN3 DONE" $R/chain3.log; do sleep 20; done
date
BASE=$(.venv/bin/python - <<'PY'
import json
f1 = {k: json.load(open(f"runs/s30/{k}/eval/transfer/sft.json"))["overall"]["f1"] for k in ("e1", "e3")}
print("e3" if f1["e3"] > f1["e1"] else "e1")
PY
)
echo BASE=$BASE
if [ "$BASE" = e3 ]; then SET=$R/e3/world/sft.parquet; else SET=$R/w2/sft.parquet; fi
.venv/bin/python - "$SET" <<'PY'
import pyarrow.parquet as pq, pyarrow as pa, random, sys
t = pq.read_table(sys.argv[1])
src = t.column("data_source").to_pylist()
real = [i for i,s in enumerate(src) if s.startswith("sqlite")]
demo = [i for i,s in enumerate(src) if not s.startswith("sqlite")]
pick = sorted(real + random.Random(0).sample(demo, 60))
pq.write_table(t.take(pa.array(pick)).replace_schema_metadata(t.schema.metadata), "runs/s30/mix_sft.parquet")
print("mix rows", len(pick), "real", len(real))
PY
date
$A sft $R/mix_sft.parquet --model $R/$BASE/sft --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 --epochs 1 \
  --precision bf16 --no-gradient-checkpointing --sampling length --out $R/mix > $R/mix.log 2>&1
date
$A eval $R/e1/real/test.jsonl --model $R/mix --search local:$R/e1/real/index.sqlite --config $R/b_eval.toml \
  --compare $R/$BASE/eval/transfer/sft.json -o $R/ev/mix_transfer.json --answers $R/ev/mix_transfer.parquet
date
$A eval $R/e1/world/test.jsonl --model $R/mix --search local:$R/e1/world/index.sqlite --config $R/b_eval.toml \
  --compare $R/ev/${BASE}_demo.json -o $R/ev/mix_demo.json --answers $R/ev/mix_demo.parquet
date
echo CHAIN4 DONE
