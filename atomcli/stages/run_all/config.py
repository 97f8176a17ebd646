"""The `[run-all]` settings (RunAllConfig) and every check made on a run's settings before it starts.

`load` builds the stage configs from a run's settings exactly as the single commands would, and refuses,
before anything is built or written: a bad value in any section, a `[run-all]` setting that a stage section
contradicts (run-all sets those stage keys itself), and the combinations no run can honour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from atomcli import config as cfgmod
from atomcli.config import Removed, opt
from atomcli.errors import InputError

CURRICULA = ("file", "balanced")


@dataclass
class RunAllConfig:
    model: str = opt("smollm2", "starting policy (openai:BASE_URL#MODEL: sampled by that server, trained here "
                                "from MODEL's weights; needs policy_sync)")
    policy_sync: str = opt("", "with an openai: model, how the server is brought to each new checkpoint before "
                               "the next rollout: lora-vllm, sglang-disk, vllm-reload or command:CMD "
                               "(atomcli/engines/policy_sync.py)", advanced=True)
    train: str = opt("", "training questions (FlashRAG JSONL/Parquet)")
    test: str = opt("", "test questions for evals")
    sft_data: str = opt("", "SFT trajectories; empty = skip SFT")
    search: str = opt("", "search SPEC for rollouts and evals")
    judge: str = opt("heuristic", "RRM judge SPEC (score-rrm)")
    steps: int = opt(3, "GRPO steps N (0 = none: the run ends after SFT and any rejection-sampling rounds)")
    questions_per_step: int = opt(8, "training questions per step (times the group size = trajectories)")
    eval_every: int = opt(0, "eval every K steps (0 = only before training, after SFT and at the end)")
    eval_limit: int = opt(32, "test questions per eval (0 = all)")
    eval_base: bool = opt(True, "evaluate the starting model before training")
    transfer_test: str = opt("", "a second test set (other documents) evaluated after SFT and at the end (with a "
                                 "dev split: at the final checkpoint); with a preset: the real-text benchmark "
                                 "(SQLite docs)")
    transfer_search: str = opt("", "search SPEC for transfer_test")
    transfer_limit: int = opt(0, "transfer questions per eval (0 = all)", advanced=True)
    dev_questions: int = opt(0, "hold out this many training questions that no step or round draws (the first ones "
                                "in file order that the SFT data does not answer), evaluate them like the test at "
                                "every eval point after SFT, and make the eval point with the best dev F1 the run's "
                                "final checkpoint (final.json; ties go to the later); 0 = the last eval point is final")
    curriculum: str = opt("file", "which training questions each step takes: file (file order) or balanced "
                                  "(shuffled; the hop counts take turns, so each gets an equal share of every step)",
                          advanced=True)
    max_hops: int = opt(0, "train only on questions with at most this many hops (0 = every question; evals keep "
                           "every hop count): a group that cannot succeed only teaches the policy to give up early",
                        advanced=True)
    world_style: str = opt("classic", "with a preset: the demo world's style: classic, stepwise (an expert that "
                                      "restates the question after each fact instead of counting hops) or "
                                      "stepwise-real (stepwise plus the SQLite benchmark's passages, training "
                                      "questions and expert trajectories)")
    rft_rounds: int = opt(0, "rejection-sampling rounds after SFT, before any GRPO step: the policy samples "
                             "rft_group_size answers to each training question of rft_sources that no earlier round "
                             "solved, `atom rft` keeps the right ones, and the SFT checkpoint is fine-tuned one epoch "
                             "at rft_lr on every round's kept rows; each round is an eval point (rft-NN) and never "
                             "samples a dev question. GRPO steps after the rounds start from their result; 0 = none")
    rft_group_size: int = opt(2, "with rft_rounds: samples a question each round")
    rft_sources: str = opt("", "with rft_rounds: the data_source prefixes of the training questions sampled, "
                               "comma-separated (sqlite: the real benchmark's); empty = every training question")
    rft_lr: float = opt(1e-4, "with rft_rounds: the learning rate of each round's epoch from the SFT checkpoint",
                        advanced=True)
    rft_eval_rounds: bool = opt(True, "with rft_rounds: evaluate every round's checkpoint (rft-NN); off = only the "
                                      "rounds' result is an eval point (the soup, or the last round without one), "
                                      "which saves one eval per other round", advanced=True)
    rft_soup: bool = opt(False, "with rft_rounds of 2 or more: average the rounds' checkpoints (all tuned from the "
                                "SFT checkpoint) weight by weight into rft/soup/ckpt, an eval point (rft-soup) and "
                                "the checkpoint the rounds hand on (atomcli/train/soup.py)")
    dynamic_sampling: int = opt(0, "DAPO's dynamic sampling: up to N extra rounds per step, each rolling out "
                                   "questions_per_step more questions; groups whose advantages are all 0 are "
                                   "dropped until the step has questions_per_step groups with signal (0 = off)",
                                advanced=True)
    save_every: int = opt(0, "write the step's checkpoint (weights + optimizer.pt) every K steps and at the last; "
                             "between saves the policy, AdamW state and reference stay in memory, and --resume "
                             "redoes the steps after the last saved one (0 = every step)", advanced=True)
    seed: int = opt(0, "seed for every stage")

    REMOVED: ClassVar[dict] = {
        "rft_replay": Removed("removed: mixing the expert's rows into each round's tune did worse on real "
                              "documents; drop the key"),
        "curriculum_levels": Removed("removed with the `hops` curriculum; drop the key (curriculum = file "
                                     "or balanced)"),
    }


# Stage keys run-all sets itself: (section, key) -> (the [run-all] key it comes from, set per step or round).
# A stage section that sets one to anything else would be silently overridden: it is refused instead.
OWNED = {
    ("sft", "model"): ("model", False), ("sft", "seed"): ("seed", False),
    ("rollout", "model"): ("model", True), ("rollout", "search"): ("search", False),
    ("rollout", "seed"): ("seed", False),
    ("score-rrm", "judge"): ("judge", False),
    ("aggregate-reward", "step"): ("steps", True), ("aggregate-reward", "total_steps"): ("steps", True),
    ("grpo-step", "model"): ("model", True), ("grpo-step", "seed"): ("seed", False),
    ("eval", "model"): ("model", True), ("eval", "search"): ("search", False), ("eval", "seed"): ("seed", False),
}


def check_contradictions(settings: dict, ra: RunAllConfig) -> None:
    """A stage section that sets a key run-all sets itself is an error naming both keys (a value equal to the
    `[run-all]` one is accepted: it says the same thing)."""
    for (sec, key), (source, per_step) in OWNED.items():
        given = {k.replace("-", "_"): v for k, v in cfgmod.section(settings, sec).items()}
        if key not in given:
            continue
        ours = getattr(ra, source)
        if not per_step and given[key] == ours:
            continue
        what = (f"[run-all] {source}, which sets it at every step and round" if per_step
                else f"[run-all] {source} = {ours!r}, which run-all passes to every stage")
        raise InputError(f"[{sec}] {key} = {given[key]!r} contradicts {what}",
                         hint=f"drop [{sec}] {key} (set [run-all] {source} instead)")


def load(settings: dict, context, out) -> dict:
    """The run's configs as attributes of Run (cfg, sft, rollout, score, aggregate, ig, rft, grpo, eval,
    follow, save_every), each checked; raises InputError before anything is written."""
    from atomcli.engines import policy_sync
    from atomcli.stages.aggregate_reward import AggregateConfig
    from atomcli.stages.aggregate_reward import check as check_aggregate
    from atomcli.stages.evaluate import EvalConfig
    from atomcli.stages.grpo_step import GRPOConfig
    from atomcli.stages.rft import RFTConfig
    from atomcli.stages.rollout import RolloutConfig
    from atomcli.stages.score_ig import IGConfig
    from atomcli.stages.score_rrm import ScoreConfig
    from atomcli.stages.sft import SFTConfig

    sec = lambda name: cfgmod.section(settings, name)  # noqa: E731
    cfg = cfgmod.build(RunAllConfig, sec("run-all"), source="[run-all]")
    check_contradictions(settings, cfg)
    c = {"cfg": cfg}
    c["sft"] = cfgmod.build(SFTConfig, {**sec("sft"), "model": policy_sync.trainer_model(cfg.model),
                                        "seed": cfg.seed}, source="[sft]")
    c["rollout"] = cfgmod.build(RolloutConfig, {**sec("rollout"), "search": cfg.search, "seed": cfg.seed},
                                source="[rollout]")
    c["score"] = cfgmod.build(ScoreConfig, {**sec("score-rrm"), "judge": cfg.judge}, source="[score-rrm]")
    c["aggregate"] = cfgmod.build(AggregateConfig, sec("aggregate-reward"), source="[aggregate-reward]")
    check_aggregate(c["aggregate"])  # a bad process/credit fails before SFT, not at step 1
    # [aggregate-reward] process = "ig": score-ig (with each step's policy) replaces score-rrm
    c["ig"] = cfgmod.build(IGConfig, sec("score-ig"), source="[score-ig]")
    c["rft"] = cfgmod.build(RFTConfig, sec("rft"), source="[rft]")
    c["grpo"] = cfgmod.build(GRPOConfig, {**sec("grpo-step"), "seed": cfg.seed}, source="[grpo-step]")
    # evals roll out exactly as `atom eval --config FILE` would: the [rollout] settings, then [eval]'s
    c["eval"] = cfgmod.build(EvalConfig, {**sec("eval"), "search": cfg.search, "seed": cfg.seed,
                                          "rollout": dict(sec("rollout"))}, source="[eval]")
    check_run_all(cfg)
    # a served policy follows the trainer (or the run is refused now); rounds write full-weight checkpoints too
    full = bool(cfg.sft_data) or cfg.rft_rounds > 0
    c["follow"] = policy_sync.Follower.for_run(cfg.model, cfg.policy_sync, lora=c["grpo"].lora, sft=full,
                                               context=context, state_dir=out)
    c["save_every"] = cfg.save_every or 1
    if c["follow"] is not None and c["save_every"] > 1:
        raise InputError("a served policy is synced from each step's checkpoint on disk: save_every must be 1",
                         hint="drop [run-all] save_every, or train an in-process policy (a local model)")
    return c


def check_run_all(cfg: RunAllConfig) -> None:
    """The [run-all] section's own ranges and pairings."""
    from atomcli import plugins
    for name, val in (("train", cfg.train), ("test", cfg.test), ("search", cfg.search)):
        if not val:
            raise InputError(f"run-all needs `{name}`",
                             hint="set it in the [run-all] section of --config, or use --preset demo")
    if bool(cfg.transfer_test) != bool(cfg.transfer_search):
        raise InputError("transfer_test and transfer_search go together", hint="set both in [run-all], or neither")
    plugins.check_search_spec(cfg.search)
    if cfg.transfer_search:
        plugins.check_search_spec(cfg.transfer_search)
    plugins.check_judge_spec(cfg.judge)
    check_curriculum(cfg.curriculum)
    for bad, what, hint in (
            (cfg.max_hops < 0, "max_hops must be >= 0", "0 = every training question"),
            (cfg.save_every < 0, "save_every must be >= 0", "0 = every step"),
            (cfg.dev_questions < 0, "dev_questions must be >= 0", "0 = no dev split; the last eval point is final"),
            (cfg.steps < 0, f"steps must be >= 0, got {cfg.steps}", "0 = no GRPO steps"),
            (cfg.rft_rounds < 0, f"rft_rounds must be >= 0, got {cfg.rft_rounds}",
             "rft_rounds = 0 turns rejection sampling off"),
            (cfg.rft_group_size < 1, f"rft_group_size must be >= 1, got {cfg.rft_group_size}",
             "rft_rounds = 0 turns rejection sampling off"),
            (not (math.isfinite(cfg.rft_lr) and cfg.rft_lr > 0), f"rft_lr must be > 0, got {cfg.rft_lr}",
             "rft_rounds = 0 turns rejection sampling off")):
        if bad:
            raise InputError(f"[run-all] {what}", hint=hint)


def check_curriculum(name: str) -> None:
    if name not in CURRICULA:
        raise InputError(f"unknown curriculum `{name}`",
                         hint="valid: " + ", ".join(CURRICULA) + " (shuffle, hops and sources were removed)")


def check_stage_configs(run) -> None:
    """Each stage's own range checks, now rather than when the stage first runs (after SFT, steps later)."""
    from atomcli.stages import grpo_step, rft, rollout, score_rrm, sft
    rollout.validate(run.rollout)
    score_rrm._validate(run.score)
    grpo_step._check_config(run.grpo)
    rft.check(run.rft)
    if run.cfg.sft_data:
        sft._check_config(run.sft)
