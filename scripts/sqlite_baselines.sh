#!/usr/bin/env bash
# The two no-training baselines of the shipped SQLite benchmark on its test split, and any agent's answered eval
# tables compared with both (paired bootstrap over question ids):
#   base: SmolLM2-135M-Instruct in the agent loop (the learn preset's eval settings), no training;
#   top3: the top-3 BM25 passages in the prompt, one greedy answer, no tools (scripts/sqlite_baseline.py).
#
#   scripts/sqlite_baselines.sh OUT [ANSWERED.parquet ...]
#
# OUT gets the benchmark's folder (`atom demo-world --real sqlite`) in OUT/world unless it is there, then
# base.json, top3.parquet and top3.json (each skipped when present), then one Markdown row per ANSWERED table and
# baseline: | table | baseline | baseline F1 | table F1 | difference [95% interval] |.
# An ANSWERED table is an `atom eval --answers` table or a run-all `eval/**/NAME.parquet` on the same test split.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 OUT [ANSWERED.parquet ...]" >&2; exit 2; }
OUT=$1; shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PY:-$ROOT/.venv/bin/python}
WORLD="$OUT/world"
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"
atom() { "$PY" -m atomcli "$@"; }

[[ -e "$WORLD/test.jsonl" ]] || atom demo-world --real sqlite --out "$WORLD"
[[ -e "$OUT/base.json" ]] || atom eval "$WORLD/test.jsonl" --model smollm2 --search "local:$WORLD/index.sqlite" \
  --config "$ROOT/examples/learn.toml" --out "$OUT/base.json"
[[ -e "$OUT/top3.parquet" ]] || "$PY" "$ROOT/scripts/sqlite_baseline.py" --world "$WORLD" --model smollm2 \
  --out "$OUT/top3.parquet"
[[ -e "$OUT/top3.json" ]] || atom eval "$OUT/top3.parquet" --out "$OUT/top3.json"

for rep in "$@"; do
  name=$(basename "$rep" .parquet)
  for b in base top3; do
    atom eval "$rep" --compare "$OUT/$b.json" --out "$OUT/$name-vs-$b.json" 2>/dev/null
    "$PY" - "$rep" "$b" "$OUT/$name-vs-$b.json" <<'PYEOF'
import json, sys
rep, b, path = sys.argv[1:]
c = json.load(open(path))["compare"]["overall"]["f1"]
print(f"| {rep} | {b} | {c['base']:.3f} | {c['new']:.3f} | {c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] |")
PYEOF
  done
done
