"""Stage `aggregate-reward`: outcome metrics, curriculum fusion with ATR, group advantages.

Owns `f1`, `em`, `format_penalty`, `alpha`, `reward`, `advantage` (DESIGN.md §5).

Per row, with α from the schedule at step T of T_MAX (the same α for every row; 0 with --no-atr):

    f1, em          metrics.f1 (--f1 squad|hotpot|set, the official scorers; token = squad) /
                    metrics.em (SQuAD) of `answer` vs `golden_answers`
    format_penalty  −1 when the rollout's `format_ok` is false, else 0
    reward          −1                        when ill formed
                    f1                        when the judge failed (`atr` null or `rrm_error` set):
                                              the outcome-only fallback, counted in the summary
                    f1                        with --no-atr (DeepResearcher)
                    α·atr + (1 − α)·f1        otherwise (Atom-Searcher)

Schedules: linear α = α0·(1 − T/T_MAX) (Atom-Searcher's, α0 = 0.5), cosine
α = α0·0.5·(1 + cos(π·T/T_MAX)), constant α = α0, none α = 0.

Advantage (GRPO), within each `group_id`: (R − mean) / (std + 1e-6), or R − mean with
--no-std (Dr. GRPO). `std` is the *population* standard deviation (divide by G): it is
defined for every group size and a group of one gets advantage 0. DeepResearcher/verl use
torch.std, the unbiased estimate (divide by G − 1), so their advantages are smaller by a
factor sqrt((G − 1)/G) — 0.968 for G = 16 — and verl gives a group of one its raw reward.
A group whose rewards are all equal gets advantage 0 for every member (no signal): counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from atomcli import schema
from atomcli.config import opt
from atomcli.errors import InputError, unknown_choice
from atomcli.rewards import metrics

SCHEDULES = ("linear", "cosine", "constant", "none")
EPS = 1e-6


@dataclass
class AggregateConfig:
    step: int = opt(0, "training step T")
    total_steps: int = opt(1, "total steps T_MAX")
    schedule: str = opt("linear", "alpha schedule: linear (Atom-Searcher), cosine, constant, none")
    alpha0: float = opt(0.5, "alpha at T=0")
    no_atr: bool = opt(False, "pure outcome reward (DeepResearcher), for ablations")
    no_std: bool = opt(False, "advantage without dividing by the group std (Dr. GRPO)")
    f1: str = opt(metrics.DEFAULT_F1, "F1 scorer: squad (SQuAD v1.1), hotpot (HotpotQA/FlashRAG), "
                                      "set (DeepResearcher); token = squad")

    def __post_init__(self):  # provenance records the scorer itself: token -> squad
        self.f1 = metrics.F1_ALIASES.get(self.f1, self.f1)


def input_columns(config: AggregateConfig) -> list[str]:
    """Columns needed at entry: without ATR (--no-atr) the score-rrm columns are not."""
    needed = schema.STAGE_INPUTS["aggregate-reward"]
    return [c for c in needed if c not in ("atr", "rrm_error")] if config.no_atr else list(needed)


def alpha(config: AggregateConfig) -> float:
    """The weight of ATR at step T (validates T, T_MAX, the schedule and alpha0)."""
    t, tmax = config.step, config.total_steps
    if tmax <= 0:
        raise InputError(f"--total-steps must be > 0 (got {tmax})")
    if t < 0 or t > tmax:
        raise InputError(f"--step must be between 0 and --total-steps {tmax} (got {t})")
    if config.schedule not in SCHEDULES:
        raise unknown_choice("alpha schedule", config.schedule, SCHEDULES)
    if not (math.isfinite(config.alpha0) and 0 <= config.alpha0 <= 1):
        raise InputError(f"--alpha0 must be in [0, 1] (got {config.alpha0})",
                         hint="reward = alpha*atr + (1-alpha)*f1 mixes two scores in [0, 1]")
    if config.no_atr or config.schedule == "none":
        return 0.0
    if config.schedule == "constant":
        return config.alpha0
    if config.schedule == "cosine":
        return config.alpha0 * 0.5 * (1 + math.cos(math.pi * t / tmax))
    return config.alpha0 * (1 - t / tmax)


def advantages(rewards: list[float], groups: list, *, no_std: bool = False) -> list[float]:
    """(R − group mean) / (group population std + 1e-6); without the division when no_std."""
    members: dict = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for rows in members.values():
        vals = [rewards[i] for i in rows]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i in rows:
            out[i] = rewards[i] - mean if no_std else (rewards[i] - mean) / (std + EPS)
    return out


def _check_atr(atr: list, source: str = "-") -> None:
    for row, a in enumerate(atr):
        if a is not None and not (math.isfinite(a) and 0 <= a <= 1):
            raise InputError(f"`atr` is {a}, expected a number in [0, 1] or null", row=row, column="atr",
                             hint="rerun `atom score-rrm`; a judge failure must be null with `rrm_error` set")


def run(table, config: AggregateConfig, context):
    if config.f1 not in metrics.F1_VARIANTS:
        raise unknown_choice("F1 variant", config.f1, metrics.F1_VARIANTS)
    a = alpha(config)
    schema.require(table, "aggregate-reward", columns=input_columns(config))
    n = table.num_rows
    answers = table.column("answer").to_pylist()
    golden = table.column("golden_answers").to_pylist()
    format_ok = table.column("format_ok").to_pylist()
    groups = table.column("group_id").to_pylist()
    f1 = [metrics.f1(p, g, config.f1) for p, g in zip(answers, golden)]
    em = [metrics.em(p, g) for p, g in zip(answers, golden)]
    ok = [v is True for v in format_ok]
    if config.no_atr:
        atr, failed = [None] * n, [False] * n
    else:
        atr = table.column("atr").to_pylist()
        _check_atr(atr)
        errs = table.column("rrm_error").to_pylist()
        failed = [x is None or e is not None for x, e in zip(atr, errs)]
    reward = []
    for i in range(n):
        if not ok[i]:
            reward.append(-1.0)
        elif config.no_atr or failed[i]:
            reward.append(f1[i])
        else:
            reward.append(a * atr[i] + (1 - a) * f1[i])
    adv = advantages(reward, groups, no_std=config.no_std)
    _summary(context, config, a, reward, f1, em, ok, [failed[i] and ok[i] for i in range(n)], groups)
    return schema.set_columns(table, {
        "f1": f1, "em": em, "format_penalty": [0.0 if o else -1.0 for o in ok], "alpha": [a] * n,
        "reward": reward, "advantage": adv})


def _mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _summary(context, config, a, reward, f1, em, ok, fallback, groups) -> None:
    if getattr(context, "quiet", False):
        return
    from rich.table import Table
    members: dict = defaultdict(list)
    for r, g in zip(reward, groups):
        members[g].append(r)
    flat = sum(1 for rs in members.values() if len(rs) > 1 and max(rs) == min(rs))
    singles = sum(1 for rs in members.values() if len(rs) == 1)
    n = len(reward)
    r_mean, r_std = _mean_std(reward)
    t = Table(title="aggregate-reward", show_header=False, title_justify="left")
    t.add_row("step", f"{config.step} / {config.total_steps} ({config.schedule}"
              + (", no ATR" if config.no_atr else "") + ")")
    t.add_row("alpha", f"{a:.4f}")
    t.add_row("rows / groups", f"{n} / {len(members)}")
    t.add_row("reward mean ± std", f"{r_mean:.4f} ± {r_std:.4f}")
    t.add_row(f"f1 ({config.f1}) / em ({metrics.EM_SCORER}) mean", f"{_mean_std(f1)[0]:.4f} / {_mean_std(em)[0]:.4f}")
    t.add_row("format errors", f"{n - sum(ok)} ({(n - sum(ok)) / n:.1%})")
    if not config.no_atr:
        t.add_row("judge fallbacks (f1 only)", f"{sum(fallback)}")
    t.add_row("zero-variance groups", f"{flat} of {len(members)}" + (" (no learning signal)" if flat else ""))
    t.add_row("advantage", "R - mean (no std)" if config.no_std else "(R - mean) / (population std + 1e-6)")
    context.console.print(t)
    if singles:
        context.log(f"[yellow]warning:[/] {singles} group(s) of size 1: their advantage is 0 "
                    "(roll out more samples per question, --group-size)")
