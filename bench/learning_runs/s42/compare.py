"""Issue 20's check on a `--preset real` run: every transfer eval point against the two baselines of session 33
(top-3 passages in SmolLM2's prompt, the base model in the agent loop; same 115 SQLite test questions) and against
the run's SFT, with paired 95% bootstrap intervals (atomcli/stages/compare.py).

    python bench/learning_runs/s42/compare.py RUN_DIR > bench/learning_runs/s42/compare.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from atomcli.stages import compare

BASE = Path(__file__).resolve().parents[1] / "s33" / "test115"
BASELINES = {"top-3 passages": BASE / "top3.json", "base model": BASE / "base.json"}


def load(p: Path) -> dict:
    return json.loads(p.read_text())


def main(run: Path) -> None:
    points = sorted((run / "eval" / "transfer").glob("*.json"), key=lambda p: (p.stem != "sft", p.stem))
    reports = {p.stem: rep for p in points if "per_question" in (rep := load(p))}
    refs = {name: load(p) for name, p in BASELINES.items()}
    if "sft" in reports:
        refs["the run's SFT"] = reports["sft"]
    print(f"transfer: {run}/eval/transfer (F1, paired 95% bootstrap over question ids)")
    for name, rep in refs.items():
        print(f"  {name:16s} F1 {rep['overall']['f1']:.3f}  n={rep['n']}")
    for point, rep in reports.items():
        hops = {s: round(v['f1'], 3) for s, v in sorted(rep["by_source"].items())}
        print(f"{point}: F1 {rep['overall']['f1']:.3f} (n={rep['n']}; {hops})")
        for name, ref in refs.items():
            if ref is rep:
                continue
            c = compare.compare_reports(rep, ref, baseline_name=name)
            f1 = c["overall"]["f1"]
            print(f"  vs {name:16s} {f1['diff']:+.3f} [{f1['low']:+.3f}, {f1['high']:+.3f}]  "
                  f"(n={c['n_shared']}; by source: " +
                  ", ".join(f"{s} {compare.describe(v['f1'])}" for s, v in c["by_source"].items()) + ")")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
