"""Stage `rft`: rejection sampling, the policy's own right answers kept as SFT rows.

Input: a rollout table on training questions (several samples a question, `--group-size`). Output: the rows
that answered (`finish_reason` answer, well formed) with F1 >= `--min-f1` against a golden answer, at most
`--per-question` a question (the first sampled, so easy questions do not outvote the rest). The rows keep their
token columns: `atom sft` trains on the tokens as sampled, tool tokens masked.

Why: GRPO steps of a few questions move how the policy reads real text by about as much as the draw of
questions does; rejection sampling (STaR, RAFT, ReST's "grow" step; expert iteration, a policy-improvement step
on a 0/1 reward) takes the positive half of that signal in bulk. Two rounds from the stepwise-real SFT raised
transfer to the SQLite documents each time (docs/experiments.md has the numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import InputError


class NothingKept(InputError):
    """No sampled trajectory answered right: `atom rft` exits 2 (no output); run-all ends its rounds."""


@dataclass
class RFTConfig:
    min_f1: float = opt(1.0, "keep answers with at least this F1 against a golden answer (SQuAD token F1, the "
                             "default scorer of eval and aggregate-reward; 1.0: exactly right)")
    per_question: int = opt(1, "at most this many kept trajectories a question (the first sampled)")


def check(config: RFTConfig) -> None:
    if not 0.0 <= config.min_f1 <= 1.0:
        raise InputError(f"--min-f1 must be in [0, 1], got {config.min_f1}")
    if config.per_question < 1:
        raise InputError(f"--per-question must be >= 1, got {config.per_question}")


def keep(row: dict, min_f1: float) -> bool:
    """An answered, well-formed trajectory whose answer scores at least min_f1."""
    from atomcli.rewards import metrics
    return (bool(row["format_ok"]) and row["finish_reason"] == "answer" and bool(row["answer"])
            and metrics.f1(row["answer"], row["golden_answers"]) >= min_f1)


def select(rows: list[dict], config: RFTConfig) -> list[int]:
    """Row indices kept, in table order."""
    taken: dict = {}
    kept = []
    for i, row in enumerate(rows):
        if taken.get(row["id"], 0) < config.per_question and keep(row, config.min_f1):
            taken[row["id"]] = taken.get(row["id"], 0) + 1
            kept.append(i)
    return kept


def run(table, config: RFTConfig, context):
    check(config)
    from atomcli import schema
    rows = table.select([c for c in schema.STAGE_INPUTS["rft"] if c != "messages"]).to_pylist()  # what select reads
    no_gold = schema.missing_golden(table, context, "rft", "they can never be kept")
    if len(no_gold) == len(rows):  # the cause is the table, not the policy: say so
        raise InputError(f"no row has a golden answer (`golden_answers` empty, null or blank in all {len(rows)}), "
                         "so no answer can be judged right", row=no_gold[0], column="golden_answers",
                         hint="roll out a question file whose rows carry golden_answers")
    kept = select(rows, config)
    questions = len({r["id"] for r in rows})
    if not kept:
        raise NothingKept(f"no trajectory of the {questions} questions answered right (F1 >= {config.min_f1}): "
                         "nothing to fine-tune on", hint="sample more a question (rollout --group-size) or lower "
                                                         "--min-f1")
    out = table.take(kept)
    solved = len({rows[i]["id"] for i in kept})
    context.log(f"rft: kept {len(kept)} of {len(rows)} trajectories, {solved} of {questions} questions")
    return out
