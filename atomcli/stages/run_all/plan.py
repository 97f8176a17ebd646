"""Question planning for run-all: which training questions each GRPO step draws, and the dev split.

Pure functions of the training file and the settings, so a resumed run redraws exactly the same plan.
"""

from __future__ import annotations

import re

from atomcli.errors import InputError
from atomcli.stages.run_all.config import check_curriculum

_HOPS = re.compile(r"(\d+)[ _-]?hop", re.I)


def question_hops(table) -> list[int]:
    """Hop count per training question: its `hops` value, else `Nhop` in its `data_source`, else 1
    (per row: a mixed file may give hops for some questions only)."""
    n = table.num_rows
    hops = table.column("hops").to_pylist() if "hops" in table.column_names else [None] * n
    sources = table.column("data_source").to_pylist() if "data_source" in table.column_names else [None] * n
    return [int(h) if h is not None else (int(m.group(1)) if (m := _HOPS.search(str(s or ""))) else 1)
            for h, s in zip(hops, sources)]


def plan_questions(hops: list[int], steps: int, per_step: int, curriculum: str, seed: int = 0,
                   max_hops: int = 0) -> list[list[int]]:
    """Row indices of the training questions of every step.

    file: file order, wrapping around. balanced: the hop counts take turns (`_balanced`).
    max_hops > 0: questions with more hops are never drawn, whatever the curriculum. Why: in a group
    that cannot succeed the only spread left is between samples that gave up early (a wrong answer)
    and samples that kept searching until the turn cap (reward -1), so such a group only teaches the
    policy to stop searching."""
    check_curriculum(curriculum)
    if max_hops > 0:
        keep = [i for i, h in enumerate(hops) if h <= max_hops]
        if not keep:
            raise InputError(f"no training question has at most {max_hops} hops (max_hops); "
                             f"the file has {sorted(set(hops))}", hint="raise max_hops or set it to 0")
        sub = plan_questions([hops[i] for i in keep], steps, per_step, curriculum, seed)
        return [[keep[j] for j in p] for p in sub]
    n = len(hops)
    if curriculum == "file":
        return [[(t * per_step + i) % n for i in range(per_step)] for t in range(steps)]
    import random
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return _balanced(hops, order, sorted(set(hops)), steps, per_step)


def _balanced(hops: list, order: list[int], tiers: list, steps: int, per_step: int) -> list[list[int]]:
    """Every step draws from each hop count in turn (1, 2, ..., 1, 2, ...; the first count of step t+1
    follows the last of step t), each count in its own shuffled order, cycled once used up; a count whose
    next question is already in the step gives its turn to the next count (a step never holds a question
    twice while the file has enough). Every count gets an equal share of the draws, so a rare count is
    drawn more often than its share of the file. Why: with a shuffled draw one step can hold only 1-hop
    questions, and its push on "search again" then comes only from groups where searching again is wrong."""
    queues = {h: [i for i in order if hops[i] == h] for h in tiers}
    pos = {h: 0 for h in tiers}
    plan, k = [], 0
    for _ in range(steps):
        pick: list[int] = []
        for _ in range(min(per_step, len(hops))):
            for j in range(len(tiers)):
                h = tiers[(k + j) % len(tiers)]
                q = queues[h][pos[h] % len(queues[h])]
                if q not in pick:
                    break
            k += j + 1
            pick.append(q)
            pos[h] += 1
        plan.append(pick)
    return plan


def held_out(plan: list[list[int]], n_rows: int, n: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """Row indices of the dev questions: the first n training questions (file order) that no step of
    the plan draws and that are not in `avoid` (the rows whose questions the SFT data answers), whatever
    their hop count (max_hops does not apply: the dev split stands for the test, which keeps every hop
    count). A pure function of its inputs, so resume finds the same ones.
    Why: the last step's checkpoint is one point of a noisy walk; the eval points are scored on these
    unseen training questions and the best one is the run's final checkpoint, without looking at the
    test split. The SFT's questions are left out because a dev split drawn from them scores how well a
    checkpoint remembers its SFT rather than how well it answers new questions."""
    drawn = {i for step in plan for i in step}
    return [i for i in range(n_rows) if i not in drawn and i not in avoid][:n]


def sft_rows(train, sft_data) -> frozenset[int]:
    """Rows of `train` whose question id the SFT data (a table with an `id` column) holds."""
    if sft_data is None or "id" not in sft_data.column_names or "id" not in train.column_names:
        return frozenset()
    seen = set(sft_data.column("id").to_pylist())
    return frozenset(i for i, q in enumerate(train.column("id").to_pylist()) if q in seen)
