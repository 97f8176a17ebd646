#!/usr/bin/env bash
# The two baselines of the real-text benchmark (issue 20), on its test split, and every learning arm's final
# transfer eval compared with both (paired bootstrap over question ids):
#   base: SmolLM2-135M-Instruct in the agent loop (the learn preset's rollout settings), no training;
#   top3: the top-3 BM25 passages in the prompt, one greedy answer, no tools (bench/real_docs/baseline.py).
#
#   RUNS=runs/learning bench/real_docs/baselines.sh      # after bench/learning.sh (uses RUNS/sft/real)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/learning}
REAL="$RUNS/sft/real"
OUT="$RUNS/baselines"
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
atom() { "$PY" -m atomcli "$@"; }

[[ -e "$OUT/base.json" ]] || atom eval "$REAL/test.jsonl" --model smollm2 --search "local:$REAL/index.sqlite" \
  --config examples/learn.toml --out "$OUT/base.json"
[[ -e "$OUT/top3.parquet" ]] || "$PY" bench/real_docs/baseline.py --world "$REAL" --model smollm2 --out "$OUT/top3.parquet"
[[ -e "$OUT/top3.json" ]] || atom eval "$OUT/top3.parquet" --out "$OUT/top3.json"

for rep in "$RUNS"/*/eval/transfer/step-0010.parquet "$RUNS/sft/eval/transfer/sft.parquet"; do
  arm=$(basename "$(dirname "$(dirname "$(dirname "$rep")")")")
  for b in base top3; do
    atom eval "$rep" --compare "$OUT/$b.json" --out "$OUT/$arm-vs-$b.json" 2>/dev/null
    "$PY" - "$arm" "$b" "$OUT/$arm-vs-$b.json" <<'PYEOF'
import json, sys
arm, b, path = sys.argv[1:]
r = json.load(open(path)); c = r["compare"]["overall"]["f1"]
print(f"| {arm} | {b} | {c['base']:.3f} | {c['new']:.3f} | {c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] |")
PYEOF
  done
done
