"""Stage `eval`: F1 / EM / cover-EM per data_source, decoupled from training.

Takes answered rollouts, or questions plus a model (then it runs the rollout itself,
greedy by default). Rows are matched to questions by `id`, never by position.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class EvalConfig:
    model: str = opt("", "policy to roll out when INPUT holds questions only")
    search: str = opt("ddg", "search SPEC for the rollout (with --model)")
    judge: str = opt("", "optional LLM judge SPEC for a correct/incorrect verdict next to F1")
    f1: str = opt("token", "F1 variant: token or set")
    greedy: bool = opt(True, "greedy decoding when rolling out")
    max_turns: int = opt(10, "turn cap when rolling out")
    max_new_tokens: int = opt(512, "token cap per turn when rolling out")
    seed: int = opt(0, "random seed")
    limit: int = opt(0, "evaluate only the first N questions (0 = all)")


def run(table, config: EvalConfig, context):
    raise NotBuiltError("`atom eval` is not built yet")
