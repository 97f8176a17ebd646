"""Rejection-sampling fine-tuning rows (session 38): the policy's own right answers on real training questions.

Why: GRPO steps of 4 questions move the policy's reading by about as much as the draw does (sessions 31-35: RL from
the real SFT stays within +-0.03 of its start on the 115 test questions), and the sampled policy solves only a few
real training samples a step. Rejection sampling (STaR, RAFT, ReST's "grow" step) takes the positive half of that
signal in bulk: sample the SFT policy on many training questions, keep the trajectories that answered right, and
fine-tune on them. What it teaches is the policy's own reading where it read well (which sentence it quoted, which
span it copied), in its own words and tokens.

    atom rollout runs/s34/real/train.jsonl --model CKPT --search local:runs/s34/real/index.sqlite \
        --config bench/learning_runs/s37/q_eval.toml --group-size 2 -o runs/s38/rft/roll.parquet
    python bench/real_docs/rft.py runs/s38/rft/roll.parquet runs/s38/rft/sft.parquet
    atom sft runs/s38/rft/sft.parquet --model CKPT --out ...

A trajectory is kept when it answered (format_ok, finish_reason "answer") with F1 >= --min-f1 against a golden
answer; at most --per-question per question (the first sampled), so the easy questions do not outvote the rest.
The token columns stay: `atom sft` trains on the tokens as sampled, tool tokens masked.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def keep(row: dict, min_f1: float) -> bool:
    from atomcli.rewards import metrics
    return bool(row["format_ok"]) and row["finish_reason"] == "answer" and bool(row["answer"]) and \
        metrics.f1(row["answer"], row["golden_answers"]) >= min_f1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rollouts", type=Path, help="an `atom rollout` table on training questions")
    ap.add_argument("out", type=Path, help="the SFT table to write (Parquet)")
    ap.add_argument("--min-f1", type=float, default=1.0, help="keep answers at least this right (default: exact)")
    ap.add_argument("--per-question", type=int, default=1, help="at most this many kept trajectories a question")
    args = ap.parse_args()
    import pyarrow.parquet as pq

    table = pq.read_table(args.rollouts)
    rows = table.to_pylist()
    taken: collections.Counter = collections.Counter()
    kept = []
    for i, row in enumerate(rows):
        if keep(row, args.min_f1) and taken[row["id"]] < args.per_question:
            taken[row["id"]] += 1
            kept.append(i)
    if not kept:
        sys.exit(f"{args.rollouts}: no trajectory answered right (F1 >= {args.min_f1}); nothing to write")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.take(kept), args.out)
    questions = len({r["id"] for r in rows})
    by_source = collections.Counter(rows[i]["data_source"] for i in kept)
    print(f"{len(rows)} trajectories on {questions} questions: kept {len(kept)} on {len(taken)} questions "
          f"({dict(sorted(by_source.items()))}) -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
