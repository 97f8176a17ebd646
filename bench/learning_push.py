"""The push on "search again" (bench/learning_hops.py --decisions) recomputed under each `--truncated` rule
of aggregate-reward, from a run's step tables (bench/LEARNING.md, session 17): penalty (as the run did, if it
ran with the default), mask (cut samples out of their group) and fail (cut samples ranked as wrong answers).
Advantages are recomputed with aggregate-reward's own `advantages`; the rewards are the tables'.

    python bench/learning_push.py runs/w16/fused runs/w16/fused-mask
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from atomcli import tableio
    from atomcli.agent.episode import TRUNCATED
    from atomcli.stages.aggregate_reward import advantages
    print("| run | step | samples at a cap | push: penalty | mask | fail |")
    print("|---|---|---|---|---|---|")
    for run in map(Path, sys.argv[1:]):
        for path in sorted((run / "steps").glob("*/rewarded.parquet")):
            rows = tableio.read_table(str(path)).to_pylist()
            cut = [r["finish_reason"] in TRUNCATED for r in rows]
            groups = [r["group_id"] for r in rows]
            reward = [r["reward"] for r in rows]
            a = rows[0]["alpha"]
            wrong = [a * (r["atr"] or 0.0) if c else r["reward"] for r, c in zip(rows, cut)]
            rules = {"penalty": advantages(reward, groups),
                     "mask": advantages(reward, [("cut", i) if c else g for i, (g, c) in enumerate(zip(groups, cut))]),
                     "fail": advantages(wrong, groups)}
            choice = [max(r["n_search"] - 1, 0) - (r["finish_reason"] == "answer" and r["n_search"] >= 1)
                      for r in rows]
            push = {k: sum(x * c for x, c in zip(adv, choice)) for k, adv in rules.items()}
            print(f"| {run.name} | {int(path.parent.name)} | {sum(cut)} | {push['penalty']:+.2f} | "
                  f"{push['mask']:+.2f} | {push['fail']:+.2f} |")


if __name__ == "__main__":
    main()
