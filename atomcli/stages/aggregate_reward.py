"""Stage `aggregate-reward`: outcome metrics, curriculum fusion with a process reward, group advantages.

Owns `f1`, `em`, `format_penalty`, `alpha`, `reward`, `advantage`, and `turn_advantages` with
`--credit turn` (docs/design.md, "Rewards and advantages").

The process reward (`--process`) is ATR from `score-rrm` (`atr`, the default: Atom-Searcher),
the information gain from `score-ig` (`ig`: IGPO's signal, the sum of the turn gains, in
[-1, 1] with `score-ig --ig prob`), or none (DeepResearcher's pure outcome; the old
`--no-atr` still means it, with a deprecation line). Per row, with α from the schedule at step
T of T_MAX (the same α for every row; 0 with --process none):

    f1, em          metrics.f1 (--f1 squad|hotpot|set, the official scorers; token = squad) /
                    metrics.em (SQuAD) of `answer` vs `golden_answers`
    format_penalty  −1 when the rollout's `format_ok` is false, else 0
    reward          −1                        when ill formed
                    f1                        when the process scorer failed (`atr`/`ig` null, or
                                              `rrm_error`/`ig_error` set): the outcome-only
                                              fallback, counted in the summary
                    f1                        with --process none (DeepResearcher)
                    α·P + (1 − α)·f1          otherwise, P = atr or ig (Atom-Searcher's fusion)

Schedules: linear α = α0·(1 − T/T_MAX) (Atom-Searcher's, α0 = 0.5), cosine
α = α0·0.5·(1 + cos(π·T/T_MAX)), constant α = α0, none α = 0.

Advantage (GRPO), within each `group_id`: (R − mean) / (std + 1e-6), or R − mean with
--no-std (Dr. GRPO). `std` is the *population* standard deviation (divide by G): it is
defined for every group size and a group of one gets advantage 0. DeepResearcher/verl use
torch.std, the unbiased estimate (divide by G − 1), so their advantages are smaller by a
factor sqrt((G − 1)/G) — 0.968 for G = 16 — and verl gives a group of one its raw reward.
A group whose rewards are all equal gets advantage 0 for every member (no signal): counted.

Flat outcomes (`--flat-outcome`). A group whose outcomes (f1, −1 when ill formed) are all
equal — every sample failed a question the policy cannot yet solve, or all solved it — still
gets a spread of rewards from the process reward alone, so by default (`process`, Atom-
Searcher's fusion as written) the policy is trained on the judge alone there. With `skip`
such a group's advantages (and turn advantages) are 0: the process reward then only ranks
trajectories whose outcomes differ. Why: with a stand-in judge (the heuristic RRM) the
learning study (docs/experiments.md) found the policy optimized on the judge alone once the
hard questions' groups were all F1 = 0, and the outcome-only reward, which skips such
groups, learned more; `skip` keeps the fusion where the outcome has signal.

Truncated trajectories (`--truncated`). A trajectory that ran out of turns or of context
(`finish_reason` max_turns or length) has no answer, so it is ill formed: reward −1 either way.
With `penalty` (the default) it takes part in its group's advantage like any row: it ranks
below every answered sample, wrong answers included. With `mask` (DAPO's overlong
filtering, for turns as well as tokens) its advantage (and turn advantages) are 0 and it stays
out of its group's mean and std: the group's answered samples are ranked among themselves.
With `fail` it is ranked as a wrong answer: its advantage is computed from the reward an
answer with F1 0 would get (α·P with its process reward, else 0), so running out of turns is
neither better nor worse than guessing wrong.
Why: a budget is not a choice the policy made. In the learning study the few samples that
hit a 4-turn cap each made two or three "search again" choices with an advantage near −2,
which outweighed every answered sample's push and taught the policy to answer after one
search; with `mask` nothing taught it to stop any more, and a few steps later it searched until
the cap on most test questions. Ill-formed samples that did answer (bad tags) are not
truncated and keep their −1 under every choice.

Turn-level credit (`--credit turn`, IGPO). `reward` and `advantage` stay the trajectory-level
values above (the summary and the step metrics read them; grpo-step falls back to
`advantage`), and `turn_advantages` adds one advantage per assistant turn (the runs of 1s in
`loss_mask`), which grpo-step gives to that turn's sampled tokens. With r[i][t] the process
reward of turn t of row i (`turn_ig`, or with `--process atr` the mean score / 10 of that
turn's atomic thoughts, 0 for a turn without any), O[i] the outcome (f1, −1 when ill formed)
and T[i] the row's turns:

    Â[i]      = the GRPO advantage of O within the group (as above; --no-std applies)
    r̃[i][t]   = (r[i][t] − μ_g) / (σ_g + 1e-6)      μ_g, σ_g: mean and population std of
                                                    every turn reward of the group, pooled
    A[i][t]   = α·Σ_{k≥t} γ^(k−t)·r̃[i][k] + (1 − α)·γ^(T[i]−1−t)·Â[i]

that is, the turn's own normalized reward, the discounted (`--gamma`, default 1) sum of the
later turns' ones, and the final outcome arriving with the last turn — IGPO's turn-level
return with its process and outcome rewards normalized separately (its "separate" mode;
with α = 0.5 the advantages are half of IGPO's) and weighted by the same α schedule as the
trajectory-level fusion, so that at α = 0 (the end of the linear schedule, or
--process none) every turn gets exactly the trajectory's outcome advantage.

Why pooled: the policy decides when an episode ends, so turn position t exists only in the
episodes that lasted t turns. Normalizing per position (turn t against the other turns t of
the group, as a naive per-turn GRPO does) compares late turns only with other long
episodes, a self-selected subset whose mean and spread differ from the group's (one
surviving episode at a position gets advantage 0 whatever it did); pooling gives every
turn the same baseline, whatever its position and however many episodes got there. And
because the pooled rewards are centered, a turn adds its deviation from the group's mean
turn: with γ = 1 an episode does not earn more for being longer (summing raw gains would
pay for length whenever the mean gain is positive). Rows without usable turn rewards (ill
formed: reward −1; or their process score failed) stay out of the pool and give every turn
their outcome advantage Â[i]. A group of one has Â = 0 but still ranks its own turns when it
has two or more with different rewards; a one-turn group of one gets 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar

from atomcli import schema, stats
from atomcli.agent.episode import TRUNCATED, turn_spans
from atomcli.config import Removed, opt
from atomcli.errors import InputError, unknown_choice
from atomcli.rewards import metrics

SCHEDULES = ("linear", "cosine", "constant", "none")
PROCESSES = ("atr", "ig", "none")
CREDITS = ("trajectory", "turn")
FLAT_OUTCOMES = ("process", "skip")
TRUNCATIONS = ("penalty", "fail", "mask")
EPS = 1e-6
# the columns each process reward needs, and with --credit turn its per-turn form
PROCESS_COLUMNS = {"atr": ["atr", "rrm_error"], "ig": ["ig", "ig_error"], "none": []}
TURN_COLUMNS = {"atr": ["atomic_thoughts"], "ig": ["turn_ig"], "none": []}


@dataclass
class AggregateConfig:
    step: int = opt(0, "training step T")
    total_steps: int = opt(1, "total steps T_MAX")
    schedule: str = opt("linear", "alpha schedule: linear (Atom-Searcher), cosine, constant, none")
    alpha0: float = opt(0.5, "alpha at T=0")
    process: str = opt("atr", "process reward fused with F1: atr (score-rrm's ATR), ig (score-ig's information "
                              "gain) or none (pure outcome)")
    credit: str = opt("trajectory", "trajectory: one advantage per trajectory (GRPO); turn: also one per assistant "
                                    "turn, `turn_advantages` (IGPO), which grpo-step then trains on")
    gamma: float = opt(1.0, "with --credit turn: discount of later turns' rewards and of the outcome", advanced=True)
    no_std: bool = opt(False, "advantage without dividing by the group std (Dr. GRPO)", advanced=True)
    flat_outcome: str = opt("process", "a group whose outcomes (F1, -1 ill formed) are all equal: process (ranked "
                                       "by the process reward alone, Atom-Searcher) or skip (advantage 0)",
                            advanced=True)
    truncated: str = opt("penalty", "a trajectory that ran out of turns or context (reward -1): penalty (ranked "
                                    "below every answer, as written), fail (ranked as a wrong answer: its "
                                    "advantage from the reward of F1 0) or mask (advantage 0, left out of its "
                                    "group's statistics: DAPO's overlong filtering)", advanced=True)
    f1: str = opt(metrics.DEFAULT_F1, "F1 scorer: squad (SQuAD v1.1), hotpot (HotpotQA/FlashRAG), "
                                      "set (DeepResearcher); token = squad")

    # `no_atr = true` was a second spelling of process = "none"
    REMOVED: ClassVar[dict] = {"no_atr": Removed("--process none", means=lambda v: {"process": "none"} if v else {})}

    def __post_init__(self):  # provenance records the scorer itself: token -> squad
        self.f1 = metrics.F1_ALIASES.get(self.f1, self.f1)


def check(config: AggregateConfig) -> None:
    """Refuse unknown or contradictory choices (before any column is read)."""
    if config.process not in PROCESSES:
        raise unknown_choice("process reward", config.process, PROCESSES)
    if config.credit not in CREDITS:
        raise unknown_choice("credit", config.credit, CREDITS)
    if config.flat_outcome not in FLAT_OUTCOMES:
        raise unknown_choice("flat-outcome", config.flat_outcome, FLAT_OUTCOMES)
    if config.truncated not in TRUNCATIONS:
        raise unknown_choice("truncated", config.truncated, TRUNCATIONS)
    if not (math.isfinite(config.gamma) and 0 <= config.gamma <= 1):
        raise InputError(f"--gamma must be in [0, 1] (got {config.gamma})")


def input_columns(config: AggregateConfig) -> list[str]:
    """Columns needed at entry: those of the chosen process reward only (none for --process none)."""
    check(config)
    needed = [c for c in schema.STAGE_INPUTS["aggregate-reward"] if c not in ("atr", "rrm_error")]
    needed += PROCESS_COLUMNS[config.process]
    if config.credit == "turn":
        needed += TURN_COLUMNS[config.process]
    if config.truncated != "penalty":
        needed.append("finish_reason")
    return needed


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
    if config.process == "none" or config.schedule == "none":
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
        if max(vals) == min(vals):  # exactly 0, not a rounding residue /1e-6: grpo-step skips these rows
            continue
        for i in rows:
            out[i] = rewards[i] - mean if no_std else (rewards[i] - mean) / (std + EPS)
    return out


def turn_advantages(turn_rewards: list, outcome: list[float], groups: list, n_turns: list[int], *,
                    alpha: float, gamma: float = 1.0, no_std: bool = False) -> list[list[float]]:
    """One advantage per turn (module docstring): α·(discounted sum of pooled-normalized turn
    rewards from t on) + (1 − α)·γ^(T−1−t)·(outcome advantage).

    turn_rewards[i]: row i's process reward per turn (n_turns[i] values), or None when it has
    none usable; such rows stay out of the pool and every turn gets the outcome advantage."""
    out_adv = advantages(outcome, groups, no_std=no_std)
    pooled: dict = defaultdict(list)
    for rewards, g in zip(turn_rewards, groups):
        if rewards is not None:
            pooled[g].extend(rewards)
    pool_stats = {g: _mean_std(vals) for g, vals in pooled.items()}
    result = []
    for i, (rewards, g) in enumerate(zip(turn_rewards, groups)):
        if rewards is None:
            result.append([out_adv[i]] * n_turns[i])
            continue
        mu, sd = pool_stats[g]
        norm = [r - mu if no_std else (r - mu) / (sd + EPS) for r in rewards]
        adv, ret, last = [0.0] * len(norm), 0.0, len(norm) - 1
        for t in range(last, -1, -1):
            ret = norm[t] + gamma * ret
            adv[t] = alpha * ret + (1 - alpha) * gamma ** (last - t) * out_adv[i]
        result.append(adv)
    return result


def flat_groups(outcome: list[float], groups: list) -> set:
    """Groups of two or more rows whose outcomes are all equal (a group of one has advantage 0 anyway)."""
    members: dict = defaultdict(list)
    for o, g in zip(outcome, groups):
        members[g].append(o)
    return {g for g, os in members.items() if len(os) > 1 and max(os) == min(os)}


def _check_atr(atr: list, source: str = "-") -> None:
    for row, a in enumerate(atr):
        if a is not None and not (math.isfinite(a) and 0 <= a <= 1):
            raise InputError(f"`atr` is {a}, expected a number in [0, 1] or null", row=row, column="atr",
                             hint="rerun `atom score-rrm`; a judge failure must be null with `rrm_error` set")


def _check_ig(ig: list, turn_ig: list | None) -> None:
    for row, x in enumerate(ig):
        if x is not None and not math.isfinite(x):
            raise InputError(f"`ig` is {x}, expected a finite number or null", row=row, column="ig",
                             hint="rerun `atom score-ig`; a scoring failure must be null with `ig_error` set")
    for row, xs in enumerate(turn_ig or []):
        if xs is not None and not all(v is not None and math.isfinite(v) for v in xs):
            raise InputError("`turn_ig` holds a null or non-finite value", row=row, column="turn_ig",
                             hint="rerun `atom score-ig`")


def _process(table, config: AggregateConfig) -> tuple[list, list[bool]]:
    """(process reward per row or None, whether the row's process score failed)."""
    n = table.num_rows
    if config.process == "none":
        return [None] * n, [False] * n
    value, err = PROCESS_COLUMNS[config.process]
    vals = table.column(value).to_pylist()
    errs = table.column(err).to_pylist()
    if config.process == "atr":
        _check_atr(vals)
    else:
        _check_ig(vals, table.column("turn_ig").to_pylist() if "turn_ig" in table.column_names else None)
    return vals, [x is None or e is not None for x, e in zip(vals, errs)]


def _turn_counts(table) -> list[int]:
    """Assistant turns per row as grpo-step will see them: runs of 1s in `loss_mask`, else `n_turns`,
    else the assistant messages."""
    if "loss_mask" in table.column_names:
        return [len(turn_spans(m or [])) for m in table.column("loss_mask").to_pylist()]
    if "n_turns" in table.column_names:
        return [int(x or 0) for x in table.column("n_turns").to_pylist()]
    return [sum(1 for m in msgs or [] if (m or {}).get("role") == "assistant")
            for msgs in table.column("messages").to_pylist()]


# what each process signal's per-turn values must be: (column, lowest, highest, the stage that makes them)
TURN_SIGNALS = {"ig": ("turn_ig", -math.inf, math.inf, "score-ig"), "atr": ("atomic_thoughts", 0.0, 10.0, "score-rrm")}


def check_turn_signal(process: str, per_row: list, n_turns: list[int], usable: list[bool]) -> None:
    """The one check of every per-turn process signal before any turn advantage is made: each value
    a finite number in the signal's range (atomic-thought scores 0-10, turn gains any finite number),
    and, on the rows that are used, each value on one of the row's assistant turns (the runs of 1s in
    `loss_mask`) — `turn_ig` one value per turn. InputError naming the row and column (exit 2).

    per_row[i]: row i's (turn, value) pairs, or None when the row has none."""
    column, lo, hi, stage = TURN_SIGNALS[process]
    hint = f"rerun `atom {stage}` on this table"
    for row, pairs in enumerate(per_row):
        for turn, v in pairs or []:
            if v is None and process == "atr":
                continue  # a thought the judge did not score (its row has rrm_error set)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi):
                want = "a finite number" if math.isinf(lo) else f"a number in [{lo:g}, {hi:g}]"
                raise InputError(f"`{column}` holds {v!r} on turn {turn}, expected {want}", row=row, column=column,
                                 hint=hint)
        if not usable[row]:
            continue
        turns = n_turns[row]
        if process == "ig" and len(pairs or []) != turns:
            raise InputError(f"`turn_ig` has {len(pairs or [])} values but the row has {turns} assistant turns",
                             row=row, column=column, hint=hint)
        for turn, _ in pairs or []:
            if not (isinstance(turn, int) and 0 <= turn < turns):
                raise InputError(f"`{column}` has a value on turn {turn!r}, but the row has {turns} assistant turns "
                                 "(the runs of 1s in `loss_mask`, numbered from 0)", row=row, column=column,
                                 hint=hint + " (was the table cut or its token columns rewritten after scoring?)")


def _turn_rewards(table, config: AggregateConfig, usable: list[bool], n_turns: list[int]) -> list:
    """Each usable row's process reward per turn (None for the others), from a checked signal."""
    n = table.num_rows
    if config.process == "none":
        return [None] * n
    if config.process == "ig":
        per_turn = table.column("turn_ig").to_pylist()
        check_turn_signal("ig", [None if xs is None else list(enumerate(xs)) for xs in per_turn], n_turns, usable)
        return [list(xs) if usable[i] else None for i, xs in enumerate(per_turn)]
    thoughts = table.column("atomic_thoughts").to_pylist()
    check_turn_signal("atr", [[(th.get("turn"), th.get("score")) for th in ths or [] if th is not None]
                              for ths in thoughts], n_turns, usable)
    out = []
    for i in range(n):
        if not usable[i]:
            out.append(None)
            continue
        by_turn: dict = defaultdict(list)
        for th in thoughts[i] or []:
            if th is not None and th.get("score") is not None:
                by_turn[th.get("turn")].append(th["score"])
        out.append([sum(by_turn[t]) / len(by_turn[t]) / 10 if by_turn[t] else 0.0 for t in range(n_turns[i])])
    return out


def run(table, config: AggregateConfig, context):
    if config.f1 not in metrics.F1_VARIANTS:
        raise unknown_choice("F1 variant", config.f1, metrics.F1_VARIANTS)
    a = alpha(config)
    schema.require(table, "aggregate-reward", columns=input_columns(config))
    n = table.num_rows
    answers = table.column("answer").to_pylist()
    golden = table.column("golden_answers").to_pylist()
    schema.missing_golden(table, context, "aggregate-reward", "their f1 and em are 0, not a judgement of the answer")
    format_ok = table.column("format_ok").to_pylist()
    groups = table.column("group_id").to_pylist()
    f1 = [metrics.f1(p, g, config.f1) for p, g in zip(answers, golden)]
    em = [metrics.em(p, g) for p, g in zip(answers, golden)]
    ok = [v is True for v in format_ok]
    proc, failed = _process(table, config)
    cut = ([r in TRUNCATED for r in table.column("finish_reason").to_pylist()] if config.truncated != "penalty"
           else [False] * n)
    # --truncated mask: each truncated row is a group of its own (advantage 0, out of its group's stats)
    masked = cut if config.truncated == "mask" else [False] * n
    groups = [("truncated", i) if masked[i] else g for i, g in enumerate(groups)]
    reward = []
    for i in range(n):
        if not ok[i]:
            reward.append(-1.0)
        elif config.process == "none" or failed[i]:
            reward.append(f1[i])
        else:
            reward.append(a * proc[i] + (1 - a) * f1[i])
    # --truncated fail: a truncated row's advantage is that of a wrong answer (F1 0, its process reward
    # fused as usual); its `reward` stays -1, the contract's value for a trajectory without an answer
    fail = cut if config.truncated == "fail" else [False] * n
    ranked = [(0.0 if config.process == "none" or failed[i] else a * proc[i]) if fail[i] else r
              for i, r in enumerate(reward)]
    adv = advantages(ranked, groups, no_std=config.no_std)
    outcome = [f1[i] if ok[i] else (0.0 if fail[i] else -1.0) for i in range(n)]
    flat = flat_groups(outcome, groups) if config.flat_outcome == "skip" and config.process != "none" else set()
    adv = [0.0 if g in flat else x for x, g in zip(adv, groups)]
    cols = {"f1": f1, "em": em, "format_penalty": [0.0 if o else -1.0 for o in ok], "alpha": [a] * n,
            "reward": reward, "advantage": adv}
    if config.credit == "turn":
        n_turns = _turn_counts(table)
        usable = [ok[i] and not failed[i] for i in range(n)]
        turn_adv = turn_advantages(_turn_rewards(table, config, usable, n_turns), outcome, groups,
                                   n_turns, alpha=a, gamma=config.gamma, no_std=config.no_std)
        cols["turn_advantages"] = [[0.0] * len(ta) if g in flat else ta for ta, g in zip(turn_adv, groups)]
    _summary(context, config, a, reward, f1, em, ok, [failed[i] and ok[i] for i in range(n)], groups, len(flat),
             cut)
    return schema.set_columns(table, cols)


def _mean_std(xs: list[float]) -> tuple[float, float]:
    m, s = stats.mean_std(xs)
    return (float("nan"), float("nan")) if m is None else (m, s)


def _summary(context, config, a, reward, f1, em, ok, fallback, groups, skipped_flat: int = 0,
             cut: list[bool] | None = None) -> None:
    """cut: the truncated rows --truncated mask|fail treats apart (with mask they are counted, not grouped)."""
    if context.quiet:
        return
    from rich.table import Table
    cut = cut or [False] * len(reward)
    members: dict = defaultdict(list)
    for r, g, c in zip(reward, groups, cut):
        if not (c and config.truncated == "mask"):
            members[g].append(r)
    flat = sum(1 for rs in members.values() if len(rs) > 1 and max(rs) == min(rs))
    singles = sum(1 for rs in members.values() if len(rs) == 1)
    n = len(reward)
    r_mean, r_std = _mean_std(reward)
    t = Table(title="aggregate-reward", show_header=False, title_justify="left")
    t.add_row("step", f"{config.step} / {config.total_steps} ({config.schedule}"
              + (", no ATR" if config.process == "none" else "") + ")")
    t.add_row("process / credit", f"{config.process} / {config.credit}"
              + (f" (gamma {config.gamma:g})" if config.credit == "turn" else ""))
    t.add_row("alpha", f"{a:.4f}")
    t.add_row("rows / groups", f"{n} / {len(members)}")
    t.add_row("reward mean ± std", f"{r_mean:.4f} ± {r_std:.4f}")
    t.add_row(f"f1 ({config.f1}) / em ({metrics.EM_SCORER}) mean", f"{_mean_std(f1)[0]:.4f} / {_mean_std(em)[0]:.4f}")
    t.add_row("format errors", f"{n - sum(ok)} ({(n - sum(ok)) / n:.1%})")
    if config.process != "none":
        who = "judge" if config.process == "atr" else "score-ig"
        t.add_row(f"{who} fallbacks (f1 only)", f"{sum(fallback)}")
    t.add_row("zero-variance groups", f"{flat} of {len(members)}" + (" (no learning signal)" if flat else ""))
    if config.flat_outcome == "skip" and config.process != "none":
        t.add_row("flat-outcome groups (advantage 0)", f"{skipped_flat} of {len(members)}")
    if config.truncated != "penalty":
        how = "advantage 0" if config.truncated == "mask" else "ranked as wrong answers"
        t.add_row(f"truncated rows ({how})", f"{sum(cut)} of {n}")
    t.add_row("advantage", "R - mean (no std)" if config.no_std else "(R - mean) / (population std + 1e-6)")
    context.console.print(t)
    if singles:
        context.log(f"[yellow]warning:[/] {singles} group(s) of size 1: their advantage is 0 "
                    "(roll out more samples per question, --group-size)")
