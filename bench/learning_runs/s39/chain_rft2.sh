#!/usr/bin/env bash
# Session 39: a second rejection-sampling round (issue 20), STaR-style: the round-1 checkpoint (`rft`, session 38)
# samples the real training questions round 1 did not solve; the SFT restarts from oneq seed 1 on round 1's rows
# plus the new ones, so the new rows add questions, not a second copy of the easy ones.
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
while pgrep -f "run-all --demo --preset learn" >/dev/null; do sleep 20; done
A=.venv/bin/atom; P=.venv/bin/python; R=runs/s39/rft2; R1=runs/s38/rft; BASE=runs/s36/oneq_s1
CFG=bench/learning_runs/s37/q_eval.toml
mkdir -p $R
$P - <<'PY' || exit 1
import json, pyarrow.parquet as pq
solved = set(pq.read_table("runs/s38/rft/sft.parquet", columns=["id"]).column("id").to_pylist())
rows = [json.loads(l) for l in open("runs/s34/real/train.jsonl")]
left = [r for r in rows if r["id"] not in solved]
with open("runs/s39/rft2/unsolved.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in left)
print(f"{len(left)} of {len(rows)} training questions unsolved in round 1")
PY
echo "rollout start $(date +%H:%M:%S)"
$A rollout $R/unsolved.jsonl --model $R1/ckpt --search local:runs/s34/real/index.sqlite --config $CFG \
   --group-size 2 --seed 1 -o $R/roll.parquet || exit 1
echo "filter $(date +%H:%M:%S)"
$A rft $R/roll.parquet -o $R/new.parquet || exit 1
$P -c "
import pyarrow as pa, pyarrow.parquet as pq
a = pq.read_table('$R1/sft.parquet'); b = pq.read_table('$R/new.parquet').select(a.column_names).cast(a.schema)
pq.write_table(pa.concat_tables([a, b]), '$R/sft.parquet'); print(a.num_rows, '+', b.num_rows, 'rows')" || exit 1
echo "sft start $(date +%H:%M:%S)"
$A sft $R/sft.parquet --model $BASE --out $R/ckpt --lr 1e-4 --warmup-ratio 0.1 --batch-size 2 --grad-accum 2 \
   --epochs 1 --precision bf16 --no-gradient-checkpointing --seed 0 || exit 1
echo "eval start $(date +%H:%M:%S)"
$A eval runs/s34/real/test.jsonl --model $R/ckpt --search local:runs/s34/real/index.sqlite --config $CFG \
   --compare $BASE/transfer.json -o $R/transfer.json --answers $R/transfer.parquet
echo "end $(date +%H:%M:%S)"
