"""What the contrast arm trains on (session 45, no model run): the groups of a rejection-sampling round where one
sample answered right (F1 = 1) and another wrong. For each such pair: did both see the same tool responses, did the
wrong one have a golden answer in hand (in a tool response it saw), and is its answer a piece of the question.

    python bench/learning_runs/s45/pairs.py runs/s43/real/rft/01/rollouts.parquet runs/s43/real/rft/02/rollouts.parquet
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main(paths: list[str]) -> None:
    import pyarrow.parquet as pq

    from atomcli.rewards import metrics
    for path in paths:
        groups = collections.defaultdict(list)
        for r in pq.read_table(path).to_pylist():
            groups[r["group_id"]].append(r)
        outcomes, counts = collections.Counter(), collections.Counter()
        for rows in groups.values():
            ok = [bool(r["answer"]) and metrics.f1(r["answer"], r["golden_answers"]) >= 1.0 for r in rows]
            outcomes[f"{sum(ok)} of {len(rows)} right"] += 1
            if not any(ok) or all(ok):
                continue
            right, wrong = rows[ok.index(True)], rows[ok.index(False)]
            tools = lambda r: [m["content"] for m in r["messages"] if m["role"] == "tool"]  # noqa: E731
            seen = metrics.normalize(" ".join(tools(wrong)))
            golds = [metrics.normalize(g) for g in wrong["golden_answers"] if metrics.normalize(g)]
            said = metrics.normalize(wrong["answer"] or "")
            counts[("same tool responses" if tools(right) == tools(wrong) else "other tool responses",
                    "the wrong one had the answer in hand" if any(g in seen for g in golds) else "it had not",
                    "its answer is a piece of the question" if said and said in metrics.normalize(wrong["question"])
                    else "its answer is not in the question")] += 1
        print(f"{path}: {len(groups)} questions; {dict(sorted(outcomes.items()))}")
        print(f"  pairs (one right, one wrong): {sum(counts.values())}")
        for key in sorted(counts):
            print(f"    {' / '.join(key)}: {counts[key]}")


if __name__ == "__main__":
    main(sys.argv[1:])
