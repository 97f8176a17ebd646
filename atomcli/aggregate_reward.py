"""Stage `aggregate-reward`: outcome metrics, curriculum fusion with ATR, group advantages.

Owns `f1`, `em`, `format_penalty`, `alpha`, `reward`, `advantage` (DESIGN.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class AggregateConfig:
    step: int = opt(0, "training step T")
    total_steps: int = opt(1, "total steps T_MAX")
    schedule: str = opt("linear", "alpha schedule: linear (Atom-Searcher), cosine, constant, none")
    alpha0: float = opt(0.5, "alpha at T=0")
    no_atr: bool = opt(False, "pure outcome reward (DeepResearcher), for ablations")
    no_std: bool = opt(False, "advantage without dividing by the group std (Dr. GRPO)")
    f1: str = opt("token", "F1 variant: token (SQuAD bag of tokens) or set (DeepResearcher)")


def run(table, config: AggregateConfig, context):
    raise NotBuiltError("`atom aggregate-reward` is not built yet")
