"""The per-step diagnostics of a training run: their names, how each is computed, how it is drawn.

One line of `metrics.jsonl` per GRPO step, from the step's rewarded table and the metrics
grpo-step saved in its checkpoint. The names are defined here once; run-all writes them and
the run report reads them, so a renamed metric cannot silently drop a curve. They are the
signals that make a collapse visible: reward spread, groups with no signal, KL, entropy,
clipping, gradient norm, response length, tool use, format errors, judge fallbacks.
"""

from __future__ import annotations

from collections import defaultdict

from atomcli.stats import mean, mean_std

# from the rewarded table
STEP = "step"
ALPHA = "alpha"
REWARD_MEAN, REWARD_STD = "reward_mean", "reward_std"
F1, ATR = "f1", "atr"
IG = "ig"                                     # mean information gain (score-ig), when the step used it
ZERO_VAR_GROUPS = "zero_variance_groups"      # fraction of groups whose rewards are all equal
FLAT_OUTCOME_GROUPS = "flat_outcome_groups"   # fraction of groups whose outcomes (F1, -1 ill formed) are all equal
FORMAT_ERROR = "format_error_rate"
SEARCHES, BROWSES, TURNS = "searches", "browses", "turns"
RESPONSE_TOKENS = "response_tokens"           # tokens the policy sampled per trajectory
JUDGE_FALLBACKS = "judge_fallbacks"           # rows whose reward fell back to F1 (judge failed)
TIME_MIN = "time_min"
SAMPLED_GROUPS = "sampled_groups"             # with dynamic sampling: groups rolled out for the step
KEPT_GROUPS = "kept_groups"                   # with dynamic sampling: groups with signal trained on
# from grpo-step's checkpoint metrics (the keys grpo_step.grpo_update returns)
LOSS, KL, ENTROPY = "loss", "kl", "entropy"
CLIP_LOW, CLIP_HIGH = "clip_low", "clip_high"
GRAD_NORM, TOKENS_PER_S = "grad_norm", "tokens_per_s"
SKIPPED = "skipped_zero_advantage"
FROM_CHECKPOINT = (LOSS, KL, ENTROPY, CLIP_LOW, CLIP_HIGH, GRAD_NORM, TOKENS_PER_S, SKIPPED)

# (key, plot title) in plot order
CURVES = [(REWARD_MEAN, "reward mean"), (REWARD_STD, "reward std"), (F1, "train F1"), (ATR, "ATR"), (IG, "information gain"),
          (ALPHA, "alpha"), (ZERO_VAR_GROUPS, "zero-variance groups"),
          (FLAT_OUTCOME_GROUPS, "flat-outcome groups"), (KL, "KL to reference"),
          (ENTROPY, "entropy"), (CLIP_LOW, "clip fraction (low)"), (CLIP_HIGH, "clip fraction (high)"),
          (GRAD_NORM, "grad norm"), (RESPONSE_TOKENS, "sampled tokens / trajectory"),
          (SEARCHES, "searches / trajectory"), (BROWSES, "browses / trajectory"),
          (FORMAT_ERROR, "format-error rate"), (JUDGE_FALLBACKS, "judge fallbacks")]
# columns of the summary's step table
TABLE = [STEP, ALPHA, REWARD_MEAN, REWARD_STD, F1, ATR, IG, ZERO_VAR_GROUPS, FLAT_OUTCOME_GROUPS, FORMAT_ERROR, SEARCHES, KL,
         ENTROPY, CLIP_LOW, CLIP_HIGH, GRAD_NORM, LOSS]


def zero_variance_fraction(rewards: list, groups: list) -> float | None:
    members: dict = defaultdict(list)
    for r, g in zip(rewards, groups):
        members[g].append(r)
    if not members:
        return None
    return sum(1 for rs in members.values() if max(rs) == min(rs)) / len(members)


def step_line(step: int, rewarded: dict, ckpt_metrics: dict) -> dict:
    """The diagnostics of one step. `rewarded`: the rewarded table as a column dict."""
    rewards = rewarded["reward"]
    atr = rewarded.get("atr")
    errs = rewarded.get("rrm_error")
    fallbacks = None
    if atr is not None and errs is not None:
        fallbacks = sum(1 for a, e, ok in zip(atr, errs, rewarded["format_ok"]) if ok and (a is None or e is not None))
    line = {
        STEP: step, ALPHA: rewarded["alpha"][0] if rewarded["alpha"] else None,
        REWARD_MEAN: mean(rewards), REWARD_STD: mean_std(rewards)[1], F1: mean(rewarded["f1"]),
        ATR: mean(atr) if atr is not None else None,
        IG: mean(rewarded["ig"]) if rewarded.get("ig") is not None else None,
        ZERO_VAR_GROUPS: zero_variance_fraction(rewards, rewarded["group_id"]),
        FLAT_OUTCOME_GROUPS: zero_variance_fraction(
            [f if ok else -1.0 for f, ok in zip(rewarded["f1"], rewarded["format_ok"])], rewarded["group_id"]),
        FORMAT_ERROR: mean([0.0 if ok else 1.0 for ok in rewarded["format_ok"]]),
        SEARCHES: mean(rewarded["n_search"]), BROWSES: mean(rewarded["n_browse"]), TURNS: mean(rewarded["n_turns"]),
        RESPONSE_TOKENS: mean([sum(m) for m in rewarded["loss_mask"]]),
        JUDGE_FALLBACKS: fallbacks,
    }
    for k in FROM_CHECKPOINT:
        if k in ckpt_metrics:
            line[k] = ckpt_metrics[k]
    return line
