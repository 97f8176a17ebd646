"""The 115-question transfer reports: each agent's 55 old answers (its earlier report) + its 60 new ones."""
import json, subprocess, sys
import pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, "/work/main")
from atomcli.stages.compare import compare_reports
R = "runs/s33"
OLD = {"mix": "runs/s30/ev/mix_transfer.parquet", "rl3": "runs/s31/rl/transfer-step-0003.parquet",
       "mix4": "runs/s32/mix4/transfer.parquet", "mix5": f"{R}/mix5/transfer.parquet"}
def ev(src, out):
    subprocess.run([".venv/bin/atom", "eval", src, "-o", out], check=True, capture_output=True)
    return json.load(open(out))
reps = {}
for name, old in OLD.items():
    a, b = pq.read_table(old), pq.read_table(f"{R}/base/{name}_new60.parquet")
    cols = [c for c in a.schema.names if c in b.schema.names]
    t = pa.concat_tables([a.select(cols), b.select(cols).cast(a.select(cols).schema)])
    pq.write_table(t, f"{R}/base/{name}_all.parquet")
    reps[name] = ev(f"{R}/base/{name}_all.parquet", f"{R}/base/{name}_all.json")
for b in ("top3", "base"):
    reps[b] = json.load(open(f"{R}/base/{b}.json"))
def f(x): return f"{x:.3f}"
def d(c): return f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"
def mean(r, new):
    v = [q["f1"] for i, q in r["per_question"].items() if (int(i.rsplit("_", 1)[1]) >= 600) == new]
    return sum(v) / len(v)
print("| agent | F1 (115) | old 55 | new 60 | 1-hop | 2-hop | vs top-3 | vs base | vs mix4 |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("top3", "base", "mix", "rl3", "mix4", "mix5"):
    r = reps[name]
    cells = [name, f(r["overall"]["f1"]), f(mean(r, False)), f(mean(r, True)),
             f(r["by_source"]["sqlite_1hop"]["f1"]), f(r["by_source"]["sqlite_2hop"]["f1"])]
    for b in ("top3", "base", "mix4"):
        cells.append("–" if b == name or name in ("top3", "base") else d(compare_reports(r, reps[b])["overall"]["f1"]))
    print("| " + " | ".join(cells) + " |")
c = compare_reports(reps["mix5"], reps["mix4"])
print("mix5 vs mix4 by source:", {k: d(v["f1"]) for k, v in c.get("by_source", {}).items()})
