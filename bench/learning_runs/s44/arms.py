"""Session 44's arms against session 43's chain, point by point, on the same questions: F1 differences with paired
95% bootstrap intervals (atomcli/stages/compare.py), for the demo test split (eval/NAME.json) and the transfer split
(eval/transfer/NAME.json). Each argument is NEW_RUN:NEW_POINT=OLD_RUN:OLD_POINT.

    python bench/learning_runs/s44/arms.py runs/s43/replay:rft-01=runs/s43/real:rft-01 ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from atomcli.stages import compare


def report(run: str, point: str, split: str) -> dict:
    return json.loads((Path(run) / "eval" / split / f"{point}.json").read_text())


def main(pairs: list[str]) -> None:
    for pair in pairs:
        new, old = (side.split(":") for side in pair.split("="))
        print(f"{new[0]} {new[1]}  vs  {old[0]} {old[1]}")
        for split, name in (("", "demo test"), ("transfer", "transfer")):
            a, b = report(*new, split), report(*old, split)
            c = compare.compare_reports(a, b, baseline_name=f"{old[0]} {old[1]}")
            by = ", ".join(f"{s} {compare.describe(v['f1'])}" for s, v in c["by_source"].items())
            print(f"  {name:9s} F1 {a['overall']['f1']:.3f} vs {b['overall']['f1']:.3f}: "
                  f"{compare.describe(c['overall']['f1'])} (n={c['n_shared']}; {by})")


if __name__ == "__main__":
    main(sys.argv[1:])
