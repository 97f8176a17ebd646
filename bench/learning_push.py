"""The push on "search again" (bench/learning_hops.py --decisions) recomputed under each `--truncated` rule
of aggregate-reward, from a run's step tables (bench/LEARNING.md, session 17): penalty, mask (cut samples
out of their group) and fail (cut samples ranked as wrong answers). Each rule reruns the aggregate-reward
stage itself on the step's table, with the run's own [aggregate-reward] settings (config.json) and only
`truncated` changed; a step whose recomputed alpha differs from the table's is refused.

    python bench/learning_push.py runs/w16/fused runs/w16/fused-mask
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    from learning_hops import search_again

    from atomcli import tableio
    from atomcli.agent.episode import TRUNCATED
    from atomcli.context import Context
    from atomcli.stages import aggregate_reward
    ctx = Context(quiet=True)
    print("| run | step | samples at a cap | push: penalty | mask | fail |")
    print("|---|---|---|---|---|---|")
    for run in map(Path, sys.argv[1:]):
        config = json.loads((run / "config.json").read_text())
        base = aggregate_reward.AggregateConfig(**config.get("aggregate-reward", {}),
                                                total_steps=config["run-all"]["steps"])
        for path in sorted((run / "steps").glob("*/rewarded.parquet")):
            table = tableio.read_table(str(path))
            step = int(path.parent.name)
            push, cut = {}, 0
            for rule in aggregate_reward.TRUNCATIONS:
                # run-all gives step directory k the schedule's T = k - 1 (alpha 0.5 at the first step)
                out = aggregate_reward.run(table, dataclasses.replace(base, step=step - 1, truncated=rule), ctx)
                if out.column("alpha").to_pylist() != table.column("alpha").to_pylist():
                    sys.exit(f"{path}: the recomputed alpha differs from the table's (not this run's settings?)")
                rows = out.select(["advantage", "n_search", "finish_reason"]).to_pylist()
                push[rule] = sum(r["advantage"] * search_again(r["n_search"], r["finish_reason"]) for r in rows)
                cut = sum(r["finish_reason"] in TRUNCATED for r in rows)
            print(f"| {run.name} | {step} | {cut} | {push['penalty']:+.2f} | {push['mask']:+.2f} | "
                  f"{push['fail']:+.2f} |")


if __name__ == "__main__":
    main()
