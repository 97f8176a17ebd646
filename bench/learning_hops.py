"""Which training trajectories succeeded, by hop count and searches (bench/LEARNING.md, "Why the multi-hop
questions are lost"): read a learning run's step tables and count, per hop count, the trajectories that
were solved (F1 > 0.5), solved with two or more searches, and that searched twice at all; with
`--advantage`, also the sum of the trajectories' advantages by hop count and searches (1 or >= 2), which
shows which way the groups push the "search again" decision. With `--eval`, the arguments are answered
eval tables (a run's eval/*.parquet) instead: per hop count, the questions' mean F1 and how many
searches the policy made (0, 1, 2, 3 or more), which shows a policy that over-searches easy questions
or stops early on hard ones; `--plans` adds how many hops the first <PLAN> says the question has (the
classic demo expert's wording: "This is a 3-hop question", "into 3 lookups", "has 3 links"; a plan that
names no count, "Find X.", is a 1-hop plan) against the question's own hop count. With `--decisions`, per
step: the advantage on each "search again or answer?" choice the trajectories made after an observation
(a trajectory with n searches chose "search again" n - 1 times and, when it answered, "answer" once);
the push on "search again" is the sum of advantage x (again - answered) over the step's trajectories, and
the trajectories that hit the turn cap (ill formed, reward -1) are shown apart: they made the most
"search again" choices, each with a negative advantage.

    python bench/learning_hops.py runs/learning/fused runs/learning/outcome --steps 1-4
    python bench/learning_hops.py runs/learn40/fused --steps 1-4 --advantage
    python bench/learning_hops.py runs/w16/fused --steps 1-10 --decisions
    python bench/learning_hops.py --eval runs/learn40/fused/eval/sft.parquet runs/learn40/fused/eval/step-0010.parquet
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def counts(run: Path, steps: range) -> dict:
    from atomcli import tableio
    from atomcli.stages.run_all import question_hops
    c: dict = collections.Counter()
    for s in steps:
        t = tableio.read_table(str(run / "steps" / f"{s:04d}" / "rewarded.parquet"))
        rows = t.select(["f1", "n_search", "advantage"]).to_pylist()
        for hops, r in zip(question_hops(t), rows):
            searches = "1" if r["n_search"] <= 1 else ">=2"
            c[hops, "adv", searches] += r["advantage"]
            c[hops, "adv_n", searches] += 1
            c[hops, "n"] += 1
            c[hops, "solved"] += r["f1"] > 0.5
            c[hops, "solved_2_searches"] += r["f1"] > 0.5 and r["n_search"] >= 2
            c[hops, "searched_twice"] += r["n_search"] >= 2
    return c


PLANNED = re.compile(r"(\d+)-hop question|into (\d+) lookups|has (\d+) links")


def search_again(n_search: int, finish_reason: str) -> int:
    """A trajectory's "search again" choices minus its "answer" choice, both made after an observation
    (n searches: n - 1 times "again"; answering after at least one search: once "answer")."""
    return max(n_search - 1, 0) - (finish_reason == "answer" and n_search >= 1)


def choices(r: dict) -> list[tuple[int, int]]:
    """(0-based assistant turn, +1 "search again" / -1 "answer") for each choice made after an
    observation: a search from the second search on, and the answer when at least one search came before."""
    searched = sorted(c["turn"] for c in r["tool_calls"] or [] if c["name"] == "web_search")
    out = [(t - 1, 1) for t in searched[1:]]
    if r["finish_reason"] == "answer" and searched:
        out.append((r["n_turns"] - 1, -1))
    return out


def decisions(run: Path, steps: range) -> list[tuple]:
    """Per step: (step, trajectories at the turn cap, their advantage sum, push on "search again" from
    the cap trajectories, from the others, in all). The push is the advantage of each choice's turn
    (`turn_advantages` with per-turn credit, else the trajectory's advantage) times +1 for "search
    again", -1 for "answer"."""
    from atomcli import tableio
    from atomcli.agent.episode import MAX_TURNS
    out = []
    for s in steps:
        t = tableio.read_table(str(run / "steps" / f"{s:04d}" / "rewarded.parquet"))
        cols = ["n_search", "n_turns", "advantage", "finish_reason", "tool_calls"]
        turn = "turn_advantages" in t.column_names
        capped = adv_capped = push_capped = push_other = 0.0
        for r in t.select(cols + (["turn_advantages"] if turn else [])).to_pylist():
            adv = r["turn_advantages"] if turn and r["turn_advantages"] else None
            push = sum((adv[i] if adv and i < len(adv) else r["advantage"]) * d for i, d in choices(r))
            if r["finish_reason"] == MAX_TURNS:
                capped += 1
                adv_capped += r["advantage"]
                push_capped += push
            else:
                push_other += push
        out.append((s, int(capped), adv_capped, push_capped, push_other, push_capped + push_other))
    return out


def planned_hops(messages: list[dict]) -> str:
    """The hop count the first assistant turn's <PLAN> states ("1" when it names none), "-" without a plan."""
    first = next((m["content"] for m in messages if m["role"] == "assistant"), "")
    plan = re.search(r"<PLAN>(.*?)</PLAN>", first or "", re.S)
    if not plan:
        return "-"
    m = PLANNED.search(plan.group(1))
    return next(g for g in m.groups() if g) if m else "1"


def eval_table(path: Path) -> dict:
    """Per hop count: questions, summed F1, and trajectories by number of searches (0, 1, 2, 3+)."""
    from atomcli import tableio
    from atomcli.rewards import metrics
    from atomcli.stages.run_all import question_hops
    t = tableio.read_table(str(path))
    c: dict = collections.Counter()
    for hops, r in zip(question_hops(t), t.select(["answer", "golden_answers", "n_search", "messages"]).to_pylist()):
        c[hops, "n"] += 1
        c[hops, "plan", planned_hops(r["messages"])] += 1
        c[hops, "f1"] += metrics.f1(r["answer"], r["golden_answers"])
        c[hops, "searches", min(r["n_search"], 3)] += 1
    return c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--steps", default="1-4", help="first-last step (1-based)")
    ap.add_argument("--advantage", action="store_true", help="also the advantage mass by hops x searches")
    ap.add_argument("--decisions", action="store_true", help="per step: the advantage on the choices to search "
                                                              "again or answer after an observation")
    ap.add_argument("--eval", action="store_true", help="the arguments are answered eval tables: F1 and searches "
                                                         "by hop count")
    ap.add_argument("--plans", action="store_true", help="with --eval: the hop count the first plan states")
    args = ap.parse_args()
    if args.eval:
        tables = {path: eval_table(path) for path in args.runs}  # each table read once, for both tables
        print("| table | hops | questions | F1 | 0 searches | 1 | 2 | 3+ |")
        print("|---|---|---|---|---|---|---|---|")
        for path, c in tables.items():
            for h in sorted({k[0] for k in c}):
                print(f"| {path.parent.parent.name}/{path.stem} | {h} | {c[h, 'n']} | {c[h, 'f1'] / c[h, 'n']:.3f} | "
                      + " | ".join(str(c[h, "searches", k]) for k in range(4)) + " |")
        if args.plans:
            print("\n| table | hops | first plan says: 1 hop | 2 | 3 | 4 | no plan |")
            print("|---|---|---|---|---|---|---|")
            for path, c in tables.items():
                for h in sorted({k[0] for k in c}):
                    print(f"| {path.parent.parent.name}/{path.stem} | {h} | "
                          + " | ".join(str(c[h, "plan", k]) for k in ("1", "2", "3", "4", "-")) + " |")
        return
    a, b = (int(x) for x in args.steps.split("-"))
    runs = {run: counts(run, range(a, b + 1)) for run in args.runs}  # each run's step tables read once
    print("| run | hops | trajectories | solved (F1 > 0.5) | solved with >= 2 searches | searched >= 2 times |")
    print("|---|---|---|---|---|---|")
    for run, c in runs.items():
        for h in sorted({k[0] for k in c}):
            print(f"| {run.name} | {h} | {c[h, 'n']} | {c[h, 'solved']} | {c[h, 'solved_2_searches']} "
                  f"| {c[h, 'searched_twice']} |")
    if args.decisions:
        print("\n| run | step | trajectories at the turn cap | their advantage sum | push on \"search again\": "
              "from capped | from the others | in all |")
        print("|---|---|---|---|---|---|---|")
        for run in args.runs:
            for s, n, adv, pc, po, pa in decisions(run, range(a, b + 1)):
                print(f"| {run.name} | {s} | {n} | {adv:+.2f} | {pc:+.2f} | {po:+.2f} | {pa:+.2f} |")
    if args.advantage:
        print("\n| run | hops | advantage sum, <= 1 search (trajectories) | advantage sum, >= 2 searches (trajectories) |")
        print("|---|---|---|---|")
        for run, c in runs.items():
            for h in sorted({k[0] for k in c}):
                print(f"| {run.name} | {h} | {c[h, 'adv', '1']:+.2f} ({c[h, 'adv_n', '1']}) "
                      f"| {c[h, 'adv', '>=2']:+.2f} ({c[h, 'adv_n', '>=2']}) |")

if __name__ == "__main__":
    main()
