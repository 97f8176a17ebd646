"""`atom run-all`: the whole recipe in one process, writing what the piped chain would write.

SFT, then N steps of rollout -> score-rrm -> aggregate-reward (T = step, T_MAX = N) ->
grpo-step, with evals before training, after SFT, every K steps and at the end. With
`[aggregate-reward] process = "ig"`, score-ig (scoring with the step's own policy, or the
`[score-ig] model`) takes score-rrm's place; `credit = "turn"` trains on per-turn advantages. It calls the
same stage functions as the single commands (and writes through the same `write_stage`),
so every table under RUN_DIR equals the one the piped chain makes with the same seeds.

Layout of RUN_DIR:
    world/                      demo world (with --demo)
    sft/                        SFT checkpoint
    steps/0001/{questions,rollouts,scored,rewarded}.parquet, steps/0001/ckpt/
                                with dynamic_sampling: steps/0001/round-2/... (the same tables per
                                reserve round) and steps/0001/selected.parquet (the groups trained on)
    rft/01/{questions,rollouts,kept,rows,tune}.parquet, rft/01/ckpt/
                                with rft_rounds: each rejection-sampling round (run_rft.py)
    rft/soup/ckpt/              with rft_soup: the rounds' checkpoints averaged (atomcli/train/soup.py)
    eval/{base,sft,step-0003}.{parquet,json}
    eval/transfer/...           the second test set's evals (transfer_test)
    eval/dev/...                with dev_questions: the held-out training questions' evals of every
                                eval point after SFT; final.json names the best of them (the final checkpoint)
    metrics.jsonl, evals.jsonl, plots/*.png, summary.md, config.json, atom_run.json (the marker)

Resident loop: the policy, its AdamW state and the KL reference stay in memory from step to step
(atomcli.train.resident, handed to the stages on the context); the step tables are written every
step, the checkpoint steps/NNNN/ckpt/ every `save_every` steps and at the last.

Resume: every output is written atomically, so a file that exists is complete. `--resume` restarts
from the last step whose checkpoint was saved: the step after it keeps its tables (they were made by
the saved policy), later steps are removed and redone (at most save_every - 1 updates), and the
final weights equal an uninterrupted run's. Evals and SFT that exist are not redone. `--resume`
continues only a folder run-all made (atom_run.json) and only with the settings in its
config.json (a changed setting is refused, naming it). Every setting is checked before the
demo world is built or anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

from atomcli import config as cfgmod
from atomcli.config import opt
from atomcli.errors import InputError


@dataclass
class RunAllConfig:
    model: str = opt("smollm2", "starting policy (openai:BASE_URL#MODEL: sampled by that server, trained here "
                                "from MODEL's weights; needs policy_sync)")
    policy_sync: str = opt("", "with an openai: model, how the server is brought to each new checkpoint before "
                               "the next rollout: lora-vllm, sglang-disk, vllm-reload or command:CMD "
                               "(atomcli/engines/policy_sync.py)")
    train: str = opt("", "training questions (FlashRAG JSONL/Parquet)")
    test: str = opt("", "test questions for evals")
    sft_data: str = opt("", "SFT trajectories; empty = skip SFT")
    search: str = opt("", "search SPEC for rollouts and evals")
    judge: str = opt("heuristic", "RRM judge SPEC")
    steps: int = opt(3, "GRPO steps N")
    questions_per_step: int = opt(8, "training questions per step (times the group size = trajectories)")
    eval_every: int = opt(0, "eval every K steps (0 = only before training, after SFT and at the end)")
    eval_limit: int = opt(32, "test questions per eval (0 = all)")
    eval_base: bool = opt(True, "evaluate the starting model before training")
    transfer_test: str = opt("", "a second test set (other documents) evaluated after SFT and at the end (with a "
                                 "dev split: at the final checkpoint); "
                                 "with --demo: the real-text benchmark (SQLite docs)")
    transfer_search: str = opt("", "search SPEC for transfer_test")
    transfer_limit: int = opt(0, "transfer questions per eval (0 = all)")
    dev_questions: int = opt(0, "hold out this many training questions that no step draws (the first ones in "
                                "file order, every hop count), evaluate them like the test at every eval point "
                                "after SFT, and name the eval point with the best dev F1 the run's final "
                                "checkpoint (final.json; ties go to the later); 0 = the last step is final")
    curriculum: str = opt("file", "which training questions each step takes: file (file order), shuffle "
                                  "(seeded order), hops (shuffled; fewest hops first, all hops by the last step), "
                                  "balanced (shuffled; the hop counts take turns, so each gets an equal share of "
                                  "every step), sources (the same with each data_source taking turns: demo and "
                                  "real-text questions of each hop count in every step)")
    curriculum_levels: int = opt(2, "with curriculum=hops: hop levels admitted at step 1 (then one more at a "
                                    "time, evenly over the steps)")
    max_hops: int = opt(0, "train only on questions with at most this many hops (0 = every question; evals "
                           "keep every hop count): leave out what the policy cannot yet answer in its turn "
                           "budget, which only teaches it to give up early")
    world_style: str = opt("classic", "with --demo: the demo world's style: classic, research (namesakes, "
                                      "longer pages, a research expert, real-text train questions in SFT; "
                                      "not yet measured, issue 20), stepwise (the classic world, an expert "
                                      "that restates the question after each fact instead of counting hops) or "
                                      "stepwise-real (stepwise plus the SQLite benchmark's passages, train "
                                      "questions and expert trajectories in SFT and in the steps)")
    rft_rounds: int = opt(0, "rejection-sampling rounds after SFT, before any GRPO step (atomcli/stages/run_rft.py): "
                             "the policy samples rft_group_size answers to each training question of rft_sources "
                             "that no earlier round solved, `rft` keeps the right ones, and the SFT checkpoint is "
                             "fine-tuned one epoch at rft_lr on every round's kept rows (plus the expert's with "
                             "rft_replay); each round is an eval "
                             "point (rft-NN). Dev questions are never sampled (note: a dev split is the first "
                             "training questions in file order, demo ones in the stepwise-real world). GRPO steps "
                             "after the rounds start from the last round's checkpoint, their KL reference; 0 = none")
    rft_group_size: int = opt(2, "with rft_rounds: samples a question each round")
    rft_sources: str = opt("", "with rft_rounds: the data_source prefixes of the training questions sampled, "
                               "comma-separated (sqlite: the real benchmark's); empty = every training question")
    rft_lr: float = opt(1e-4, "with rft_rounds: the learning rate of each round's epoch from the SFT checkpoint")
    rft_replay: float = opt(0.0, "with rft_rounds: rows of sft_data (the expert's) mixed into each round's tune, "
                                 "per row of that tune (every round's kept rows so far; a seeded draw without "
                                 "repeats, at most all of them; 1.0 = as many), so that the tune keeps habits the "
                                 "kept rows lack, such as a second search (session 44, round 1 of the real preset: "
                                 "demo test F1 0.260 -> 0.397, transfer 0.271 -> 0.248); 0 = the kept rows alone")
    rft_soup: bool = opt(False, "with rft_rounds of 2 or more: average the rounds' checkpoints (all tuned from the "
                                "SFT checkpoint) weight by weight into rft/soup/ckpt, an eval point (rft-soup) and "
                                "the checkpoint the rounds hand on (atomcli/train/soup.py; session 46, the real "
                                "preset: transfer F1 0.271 / 0.274 for the rounds, 0.304 for their average)")
    dynamic_sampling: int = opt(0, "DAPO's dynamic sampling: up to N extra rounds per step, each rolling out "
                                   "questions_per_step more questions; groups whose advantages are all 0 are "
                                   "dropped until the step has questions_per_step groups with signal (0 = off)")
    save_every: int = opt(0, "write the step's checkpoint (weights + optimizer.pt) every K steps and at the last; "
                             "between saves the policy, AdamW state and reference stay in memory, and --resume "
                             "redoes the steps after the last saved one (0 = the preset's: 1 on the CPU presets; "
                             "examples/gpu-7b.toml: 10 with an in-process policy)")
    seed: int = opt(0, "seed for every stage")


CURRICULA = ("file", "shuffle", "hops", "balanced", "sources")
TRANSFER, DEV = "transfer", "dev"  # eval/ subfolders of the second test set and of the held-out train questions
FINAL_FILE = "final.json"  # which checkpoint the run chose as final, and why
_HOPS = re.compile(r"(\d+)[ _-]?hop", re.I)


def question_hops(table) -> list[int]:
    """Hop count per training question: its `hops` value, else `Nhop` in its `data_source`, else 1
    (per row: a mixed file may give hops for some questions only)."""
    n = table.num_rows
    hops = table.column("hops").to_pylist() if "hops" in table.column_names else [None] * n
    sources = table.column("data_source").to_pylist() if "data_source" in table.column_names else [None] * n
    return [int(h) if h is not None else (int(m.group(1)) if (m := _HOPS.search(str(s or ""))) else 1)
            for h, s in zip(hops, sources)]


def question_sources(table) -> list | None:
    """Each training question's data_source, or None when the file has none."""
    return table.column("data_source").to_pylist() if "data_source" in table.column_names else None


def check_curriculum(name: str) -> None:
    if name not in CURRICULA:
        from atomcli.errors import unknown_choice
        raise unknown_choice("curriculum", name, CURRICULA)


def plan_questions(hops: list[int], steps: int, per_step: int, curriculum: str, seed: int = 0,
                   levels: int = 2, max_hops: int = 0, sources: list | None = None) -> list[list[int]]:
    """Row indices of the training questions of every step (a pure function: resume redraws the same).

    hops: questions are drawn in one seeded shuffled order, never twice before every admitted
    question has been drawn once; step t admits the `levels` lowest hop counts plus one more
    level per equal share of the steps, so the last part of the run sees every hop count.
    Why: a question the policy never solves gives a group of equal rewards and no gradient;
    starting where the SFT policy sometimes succeeds keeps the groups informative.

    max_hops > 0: questions with more hops are never drawn, whatever the curriculum. Why: in a group
    that cannot succeed the only spread left is between samples that gave up early (a wrong answer)
    and samples that kept searching until the turn cap (reward -1), so such a group only teaches the
    policy to stop searching (LEARNING.md, session 17; session 18 measured the learn preset with
    max_hops = 2 and found the collapse unchanged).

    sources: each question's data_source; with curriculum=sources they take turns as the hop counts
    do with balanced (a file without them: the hop counts). Why: a mixed file (the stepwise-real world:
    400 demo questions, then the real benchmark's train split) gives the real questions only their share of
    a shuffled draw (a sixth when that split had 84), and the
    transfer to real documents is learned from them (issue 20)."""
    check_curriculum(curriculum)
    if max_hops > 0:
        keep = [i for i, h in enumerate(hops) if h <= max_hops]
        if not keep:
            raise InputError(f"no training question has at most {max_hops} hops (max_hops); "
                             f"the file has {sorted(set(hops))}", hint="raise max_hops or set it to 0")
        sub = plan_questions([hops[i] for i in keep], steps, per_step, curriculum, seed, levels,
                             sources=[sources[i] for i in keep] if sources else None)
        return [[keep[j] for j in p] for p in sub]
    n = len(hops)
    if curriculum == "file":
        return [[(t * per_step + i) % n for i in range(per_step)] for t in range(steps)]
    import random
    order = list(range(n))
    random.Random(seed).shuffle(order)
    tiers = sorted(set(hops))
    if curriculum == "balanced":
        return _balanced(hops, order, tiers, steps, per_step)
    if curriculum == "sources":
        keys = [str(x) for x in sources] if sources else [str(h) for h in hops]
        return _balanced(keys, order, sorted(set(keys)), steps, per_step)
    plan, used = [], set()
    for t in range(steps):
        if curriculum == "hops":
            extra = (len(tiers) - levels) if levels < len(tiers) else 0
            k = min(len(tiers), max(1, levels) + (t * (extra + 1)) // max(steps, 1))
            cap = tiers[k - 1]
        else:
            cap = tiers[-1]
        admitted = [i for i in order if hops[i] <= cap]
        pick = [i for i in admitted if i not in used][:per_step]
        if len(pick) < per_step:  # every admitted question drawn once: start the next round
            used -= set(admitted)
            pick += [i for i in admitted if i not in used and i not in pick][:per_step - len(pick)]
        used |= set(pick)
        plan.append(pick)
    return plan


def held_out(plan: list[list[int]], n_rows: int, n: int, avoid: frozenset[int] = frozenset()) -> list[int]:
    """Row indices of the dev questions: the first n training questions (file order) that no step of
    the plan draws and that are not in `avoid` (the rows whose questions the SFT data answers), whatever
    their hop count (max_hops does not apply: the dev split stands for the test, which keeps every hop
    count). A pure function of its inputs, so resume finds the same ones.
    Why: the last step's checkpoint is one point of a noisy walk (4 questions a step); the eval
    points are scored on these unseen training questions and the best one is the run's final
    checkpoint, without looking at the test split (LEARNING.md, session 24). The SFT's questions are
    left out since session 42: the first 50 training questions of the demo world are all among its 200
    expert SFT rows, so a dev split drawn from them scored how well a checkpoint remembers its SFT
    (the expert-rows control: dev +0.267 with test -0.020, LEARNING.md session 41)."""
    drawn = {i for step in plan for i in step}
    return [i for i in range(n_rows) if i not in drawn and i not in avoid][:n]


def sft_rows(train, sft_data) -> frozenset[int]:
    """Rows of `train` whose question id the SFT data (a table with an `id` column) holds."""
    if sft_data is None or "id" not in sft_data.column_names or "id" not in train.column_names:
        return frozenset()
    seen = set(sft_data.column("id").to_pylist())
    return frozenset(i for i, q in enumerate(train.column("id").to_pylist()) if q in seen)


def _balanced(hops: list, order: list[int], tiers: list, steps: int, per_step: int) -> list[list[int]]:
    """Every step draws from each hop count in turn (1, 2, ..., 1, 2, ...; the first count of step t+1
    follows the last of step t), each count in its own shuffled order, cycled once used up; a count whose
    next question is already in the step gives its turn to the next count (a step never holds a question
    twice while the file has enough). Every count gets an equal share of the draws, so a rare count is
    drawn more often than its share of the file. Why: with a shuffled draw one step can hold only 1-hop
    questions, and a step's push on "search again" is then all from groups where searching again is
    wrong (LEARNING.md, session 19)."""
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


# Presets are data: stage sections as a TOML file would give them.
DEMO = {
    # Sized from measured rates on 2 CPU cores (SFT ~60-140 tok/s fwd+bwd, sampling ~25-100 tok/s
    # depending on batch) to finish in about 30 minutes; see bench/RESULTS.md for the measured run.
    # A 135M model needs ~190 tokens for one expert-style turn: a smaller cap cuts tool calls.
    "run-all": {"steps": 1, "questions_per_step": 2, "eval_limit": 20, "judge": "heuristic", "transfer_limit": 10},
    # Batches of 2 rows, accumulated to 4: the same update as batches of 4 at half the peak memory. At 4 rows
    # x 2,048 tokens the learn preset's SFT peaked near 19.5 GB on a 24 GB machine, so the heap guard trimmed the
    # kept heap every step and a step took 30-45 s instead of about 22 s (LEARNING.md, session 39).
    "sft": {"max_steps": 14, "lr": 3e-4, "batch_size": 2, "grad_accum": 2, "max_length": 2048, "warmup_ratio": 0.1,
            "gradient_checkpointing": False},
    "rollout": {"group_size": 4, "max_turns": 4, "max_new_tokens": 192, "k": 3, "temperature": 1.0,
                "batch_size": 32, "date": "2026-01-01"},
    "aggregate-reward": {},
    "grpo-step": {"lr": 5e-6, "beta": 0.0, "micro_batch": 4, "gradient_checkpointing": False},
    "eval": {"max_turns": 4, "max_new_tokens": 192},
}
# The learning study (bench/LEARNING.md): a longer SFT than the demo's, then enough GRPO steps to
# move the policy, with evals on the whole test split after SFT, at the middle and at the end.
# SFT is 40 steps (160 of the 200 expert trajectories), not the demo's 14: from the 14-step SFT no
# sampled 2-hop trajectory ever solved its question with two searches, so GRPO could only sharpen the
# one-search answer (LEARNING.md, session 14). Both trainers autocast to bf16 (this CPU's AMX makes
# an SFT step 0.68x and an update 0.55x as long as fp32; bench/RESULTS.md). Sized from measured
# rates on 2 idle cores; measured at ~100 min with the transfer evals left out (over the 90-min target).
# The world is the stepwise one (the classic world, an SFT expert that never asks for a hop count): the
# classic expert's SFT policy wrote the same hop count for every question, so RL could only shift that
# count for all questions at once and collapsed to one search; the stepwise SFT is +0.12 F1 over it and
# its RL steps do not collapse (LEARNING.md, session 16).
# The steps (LEARNING.md, session 19): 1- and 2-hop questions only, two of each every step (max_hops = 2,
# balanced), rollouts at temperature 0.7, and a sample cut by the turn cap ranked as a wrong answer
# (truncated = "fail"). With every hop count, a shuffled draw, sampling at 1.0 and the penalty rule, a few
# samples looping to the cap in the first steps pushed the policy to one search for every question
# (step 10: F1 0.310, sessions 17-18); with these settings it kept searching twice where it helps and
# stopped looping (step 10: 0.390, +0.080 [+0.000, +0.160] over that checkpoint; +0.023 [-0.077, +0.120]
# over its SFT: not yet the bar).
# The reward (LEARNING.md, sessions 21-23): information gain as the process reward with per-turn credit at
# a constant weight 0.5 (process = "ig", credit = "turn", schedule = "constant"): a trajectory-level reward
# gives the "search again" words of a 1-hop and of a 2-hop sample the same credit, so GRPO could only shift
# the prior on stopping for every question at once; the gain of the turn that found the second fact
# separates them. The evals answer at the cap (force_answer, with the last-turn note) for the SFT and the
# RL checkpoints alike: without it an eval scores how often a policy runs out of turns, which a policy
# that searches more does more often while it finds more. Measured (session 23): step 5 +0.080
# [+0.003, +0.157] over the SFT, step 10 -0.053 [-0.120, +0.013] (back to one search): not yet the bar.
# The final checkpoint (LEARNING.md, session 24): 4 questions a step make each update a noisy move of
# the one prior on stopping, so the last step is one point of a walk, not the best the run found. 50
# training questions that no step draws (dev_questions) score the SFT and every eval point, and the
# best of them on that dev split is the run's final checkpoint (early stopping; the test split is
# never looked at to choose it).
# Session 40 (the 2-core Xeon with AMX): the evals took 81 of the run's 145 minutes with the fp32 sampler,
# so the policy samples from a bf16 copy in batches of 50 (a bf16 copy decodes 1.7x as fast as fp32,
# bench/RESULTS.md); and each step draws 8 questions instead of 4 (8 steps, evals at 4 and 8: 64 questions
# in all instead of 40): a step of 4 questions moved the one prior on stopping in whichever direction its
# last groups pushed (sessions 23-25 and 39: the walk peaks mid-run, then falls back).
# Session 41: what the preset trains with after its SFT is one rejection-sampling round, not GRPO steps
# (steps = 0; the GRPO settings below apply when a config sets steps). The round samples one answer at 0.7 to
# each of the 350 training questions outside the dev split (every hop count), keeps the 112 right ones and
# tunes the SFT checkpoint one epoch on them at lr 1e-4: test F1 0.513 -> 0.638, +0.125 [+0.067, +0.190]
# (every hop count up, 4-hop 0 -> 0.15), dev +0.248, in 39 minutes after the SFT. Four GRPO steps at lr
# 2e-5 moved the weights 0.023% (the SFT 0.8%, session 40); GRPO cleared the bar once (session 24,
# dev-chosen step 5) in a 160-minute run, and no faster variant did (sessions 25-40).
LEARN = {
    "run-all": {"steps": 0, "questions_per_step": 8, "eval_limit": 0, "eval_every": 4, "eval_base": False,
                "judge": "heuristic", "curriculum": "balanced", "max_hops": 2, "world_style": "stepwise",
                "dev_questions": 50, "rft_rounds": 1, "rft_sources": "demo", "rft_group_size": 1},
    "sft": {**DEMO["sft"], "max_steps": 40, "precision": "bf16"},
    "rollout": {**DEMO["rollout"], "group_size": 8, "temperature": 0.7, "precision": "bf16", "batch_size": 50},
    "aggregate-reward": {"truncated": "fail", "process": "ig", "credit": "turn", "schedule": "constant"},
    "score-ig": {"precision": "bf16"},
    "grpo-step": {"lr": 2e-5, "beta": 0.0, "micro_batch": 4, "gradient_checkpointing": False, "precision": "bf16"},
    "eval": {**DEMO["eval"], "last_turn_note": True, "force_answer": True},
}
# The `real` preset (issue 20): an agent for real documents. The stepwise-real world (the demo world plus the SQLite
# benchmark's passages, training questions and expert trajectories) with snippets led by the sentences holding the
# query's words, one SFT epoch over its 603 rows, then two rejection-sampling rounds on the 484 real training
# questions (atomcli/stages/run_rft.py). Measured outside run-all as separate commands (LEARNING.md, sessions 35-40):
# the SFT 0.228 and 0.248 on the SQLite test split (seeds 0 and 1), the rounds from seed 1's 0.273 and 0.300, with
# two samples a question. Measured as one run (session 42, seed 0, 148 minutes) with one sample a question: the SFT
# 0.254, round 1 0.204, round 2 0.220 (the rounds kept 174 1-hop and 7 2-hop answers, 179 of 181 with one search,
# and the policy dropped its second searches), so the rounds sample two answers a question again. Session 43 ran
# those two rounds from session 42's SFT (run-all --resume): 0.271, then 0.274 (+0.020 [-0.036, +0.078] over the
# SFT), in 144 minutes after the SFT's 70 (about 190 in all without other load; the SFT alone 64). The demo test
# evals use its first 50 questions. GRPO steps are left out: from this SFT they moved transfer by less than the
# draw (sessions 31-35). Seed 1 as one run (sessions 45-46): SFT 0.243, rounds 0.230 and 0.274. The rounds'
# checkpoints averaged (rft_soup, session 46) score 0.304 (seed 0) and 0.314 (seed 1), above each round: the
# preset's final checkpoint is that average.
REAL = {
    "run-all": {"steps": 0, "eval_limit": 50, "eval_base": False, "world_style": "stepwise-real",
                "rft_rounds": 2, "rft_group_size": 2, "rft_sources": "sqlite", "rft_lr": 1e-4, "rft_soup": True},
    "sft": {**DEMO["sft"], "max_steps": 0, "epochs": 1.0, "lr": 2e-4, "precision": "bf16", "sampling": "length"},
    "rollout": {**DEMO["rollout"], "group_size": 8, "temperature": 0.7, "precision": "bf16", "batch_size": 50,
                "search_options": "snippets=query"},
    "rft": {"min_f1": 1.0, "per_question": 1},
    "eval": {**DEMO["eval"], "last_turn_note": True, "force_answer": True},
}
PRESETS = {"demo": DEMO, "learn": LEARN, "real": REAL}
QUICK = {
    "run-all": {"steps": 2, "questions_per_step": 2, "eval_limit": 4, "judge": "heuristic", "transfer_limit": 2},
    "sft": {"epochs": 1.0, "lr": 1e-3, "batch_size": 2, "max_length": 1024, "gradient_checkpointing": False},
    "rollout": {"group_size": 2, "max_turns": 2, "max_new_tokens": 16, "k": 2, "batch_size": 8,
                "date": "2026-01-01"},
    "aggregate-reward": {},
    "grpo-step": {"lr": 1e-4, "beta": 0.0, "micro_batch": 2, "gradient_checkpointing": False},
    "eval": {"max_turns": 2, "max_new_tokens": 16},
}
QUICK_WORLD = {"articles": 120, "train": 12, "test": 4, "sft": 6}


def to_toml(settings: dict, header: list[str] = ()) -> str:
    """Stage sections of flat scalar settings as the TOML text `--config` reads."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)
    lines = [f"# {h}" for h in header]
    for sec, vals in settings.items():
        lines += ["", f"[{sec}]"] + [f"{k} = {value(v)}" for k, v in vals.items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def preset_toml(name: str) -> str:
    """A preset written out as the TOML file `--config` reads (examples/<name>.toml is this text)."""
    return to_toml(PRESETS[name], [
        f"The `{name}` preset of `atom run-all --demo` written out (generated from atomcli/stages/run_all.py "
        f"{name.upper()}; tests/test_run_all.py checks they agree).",
        f"Copy and edit:  atom run-all --demo --config examples/{name}.toml --out runs/mine"])


def _merge(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        for sec, vals in layer.items():
            if isinstance(vals, dict):
                out.setdefault(sec, {}).update(vals)
            else:
                out[sec] = vals
    return out


class Run:
    """One run folder: paths, stage configs and the shared context."""

    def __init__(self, out: Path, settings: dict, context):
        from atomcli.stages.aggregate_reward import AggregateConfig
        from atomcli.stages.evaluate import EvalConfig
        from atomcli.stages.grpo_step import GRPOConfig
        from atomcli.stages.rollout import RolloutConfig
        from atomcli.stages.score_ig import IGConfig
        from atomcli.stages.score_rrm import ScoreConfig
        from atomcli.stages.sft import SFTConfig

        self.out, self.ctx = out, context
        sec = lambda name: cfgmod.section(settings, name)  # noqa: E731
        self.cfg = cfgmod.build(RunAllConfig, sec("run-all"), source="[run-all]")
        from atomcli.engines import policy_sync
        self.sft = cfgmod.build(SFTConfig, {**sec("sft"), "model": policy_sync.trainer_model(self.cfg.model),
                                            "seed": self.cfg.seed}, source="[sft]")
        self.rollout = cfgmod.build(RolloutConfig, {**sec("rollout"), "search": self.cfg.search, "seed": self.cfg.seed},
                                    source="[rollout]")
        self.score = cfgmod.build(ScoreConfig, {**sec("score-rrm"), "judge": self.cfg.judge}, source="[score-rrm]")
        self.aggregate = cfgmod.build(AggregateConfig, sec("aggregate-reward"), source="[aggregate-reward]")
        from atomcli.stages.aggregate_reward import check as check_aggregate
        check_aggregate(self.aggregate)  # a bad process/credit fails before SFT, not at step 1
        # [aggregate-reward] process = "ig": score-ig (with each step's policy) replaces score-rrm
        self.ig = cfgmod.build(IGConfig, sec("score-ig"), source="[score-ig]")
        from atomcli.stages.rft import RFTConfig
        self.rft = cfgmod.build(RFTConfig, sec("rft"), source="[rft]")
        self.grpo = cfgmod.build(GRPOConfig, {**sec("grpo-step"), "seed": self.cfg.seed}, source="[grpo-step]")
        # evals roll out exactly as `atom eval --config FILE` would: the [rollout] settings, then [eval]'s
        self.eval = cfgmod.build(EvalConfig, {**sec("eval"), "search": self.cfg.search, "seed": self.cfg.seed,
                                              "rollout": dict(sec("rollout"))}, source="[eval]")
        for name, val in (("train", self.cfg.train), ("test", self.cfg.test), ("search", self.cfg.search)):
            if not val:
                raise InputError(f"run-all needs `{name}`", hint="set it in the [run-all] section of --config, or use --demo")
        if bool(self.cfg.transfer_test) != bool(self.cfg.transfer_search):
            raise InputError("transfer_test and transfer_search go together", hint="set both in [run-all], or neither")
        from atomcli import plugins
        plugins.check_search_spec(self.cfg.search)
        if self.cfg.transfer_search:
            plugins.check_search_spec(self.cfg.transfer_search)
        plugins.check_judge_spec(self.cfg.judge)
        check_curriculum(self.cfg.curriculum)  # before SFT, not at step 1
        if self.cfg.max_hops < 0:
            raise InputError("[run-all] max_hops must be >= 0", hint="0 = every training question")
        # a served policy follows the trainer (or the run is refused now, before anything is written)
        # (rft rounds write full-weight SFT checkpoints too)
        full = bool(self.cfg.sft_data) or self.cfg.rft_rounds > 0
        self.follow = policy_sync.Follower.for_run(self.cfg.model, self.cfg.policy_sync, lora=self.grpo.lora,
                                                   sft=full, context=context, state_dir=out)
        if self.cfg.save_every < 0:
            raise InputError("[run-all] save_every must be >= 0", hint="0 = the preset's default (every step)")
        self.save_every = self.cfg.save_every or 1
        if self.follow is not None and self.save_every > 1:
            raise InputError("a served policy is synced from each step's checkpoint on disk: save_every must be 1",
                             hint="drop [run-all] save_every, or train an in-process policy (a local model)")
        for bad, what in ((self.cfg.rft_rounds < 0, f"rft_rounds must be >= 0, got {self.cfg.rft_rounds}"),
                          (self.cfg.rft_group_size < 1, f"rft_group_size must be >= 1, got {self.cfg.rft_group_size}"),
                          (self.cfg.rft_lr <= 0, f"rft_lr must be > 0, got {self.cfg.rft_lr}"),
                          (not (math.isfinite(self.cfg.rft_replay) and self.cfg.rft_replay >= 0),
                           f"rft_replay must be a number >= 0, got {self.cfg.rft_replay}")):
            if bad:
                raise InputError(f"[run-all] {what}", hint="rft_rounds = 0 turns rejection sampling off")
        if self.cfg.rft_rounds and self.cfg.rft_replay > 0 and not self.cfg.sft_data:
            raise InputError("[run-all] rft_replay draws the expert's rows from sft_data, which is not set",
                             hint="set [run-all] sft_data (the expert's SFT rows), or rft_replay = 0")
        if self.cfg.dev_questions < 0:
            raise InputError("[run-all] dev_questions must be >= 0", hint="0 = no dev split; the last step is final")
        # per split ("" = the test, "transfer", "dev"): the first eval, which every later one is compared with
        self.first: dict[str, tuple[str, dict]] = {}
        self.t0 = time.time()
        self.step_times: list[float] = []  # durations of the steps this process ran, for the ETA
        self.step_start: float | None = None
        self.candidates: list[tuple[str, str]] = []  # (eval name, checkpoint) with a dev eval, in order

    # -- helpers ----------------------------------------------------------------------------

    def log(self, msg: str):
        el = time.time() - self.t0
        self.ctx.log(f"[dim]{el / 60:5.1f} min[/] {msg}")

    def step_dir(self, t: int) -> Path:
        return self.out / "steps" / f"{t + 1:04d}"

    def read(self, path: Path, stage: str | None = None):
        from atomcli import envelope, tableio
        return envelope.read_input(str(path), stage) if stage else tableio.read_table(str(path))

    def table_stage(self, stage: str, mod, cfg, inp: Path, out: Path):
        """Read, run and write one table stage, skipping it when its output exists (resume)."""
        from atomcli import envelope
        if out.exists():
            return
        self.log(f"{stage} -> {out.relative_to(self.out)}")
        envelope.table_to_table(stage, mod, cfg, str(inp), str(out), self.ctx)

    def rollout_stage(self, cfg, inp: Path, out: Path):
        from atomcli.stages import rollout, rollout_io
        if out.exists():
            return
        if self.follow is not None:  # the server is made to serve this checkpoint first
            cfg = self.follow.rollout_config(cfg)
        self.log(f"rollout ({cfg.model}) -> {out.relative_to(self.out)}")
        table = self.read(inp, "rollout")
        rollout_io.run_to_file(rollout, table, cfg, self.ctx, out=str(out), fmt=None, resume=True)

    def train_stage(self, stage: str, mod, cfg, inp: Path, out: Path):
        from atomcli import envelope
        if (out / "config.json").exists():
            return
        self.log(f"{stage} ({cfg.model}) -> {out.relative_to(self.out)}")
        envelope.table_to_checkpoint(stage, mod, cfg, str(inp), str(out), self.ctx)
        self.ctx.forget_models()
        from atomcli import heap
        before, after = heap.release()  # the training heap's holes are of no use to the sampling that follows
        if before is not None and after is not None:
            self.log(f"heap released after {stage}: resident {before:,.0f} -> {after:,.0f} MB")

    def grpo_stage(self, t: int, cfg, inp: Path, out: Path) -> dict:
        """grpo-step on the resident policy (atomcli.train.resident): it continues in memory, and its
        checkpoint is written every `save_every` steps and at the last. Returns the update's metrics
        (as metrics.json holds them); a saved checkpoint is not redone."""
        from atomcli import checkpoint, envelope, schema
        from atomcli.stages import grpo_step
        from atomcli.train.resident import after_update
        if (out / "config.json").exists():
            return json.loads((out / checkpoint.METRICS_FILE).read_text())
        # with a dev split every eval point may become the final checkpoint: it is kept on disk
        save = (t + 1) % self.save_every == 0 or t + 1 == self.cfg.steps or \
            bool(self.cfg.dev_questions and self.is_eval_point(t))
        self.log(f"grpo-step ({cfg.model}) -> {out.relative_to(self.out)}{'' if save else ' (in memory)'}")
        result = envelope.train_from_table("grpo-step", grpo_step, cfg, str(inp), str(out), self.ctx)
        self.ctx.resident = after_update(self.ctx.resident, cfg.model, str(out), result, cfg)
        if save:
            checkpoint.save(result, str(out), stage="grpo-step", config=cfg, context=self.ctx,
                            state=self.ctx.resident.state)
        self.ctx.forget_models()  # models loaded from disk (the SFT checkpoint's sampler) are not needed again
        return json.loads(json.dumps(schema._jsonable(result.metrics)))

    def evaluate(self, name: str, model: str, *, split: str = "") -> dict:
        """Greedy rollout of the test questions, then scores; cached as eval/<name>.json.

        split: "transfer" (the second test set, eval/transfer/) or "dev" (the held-out training
        questions, eval/dev/), each compared with its own first eval."""
        from atomcli import tableio
        from atomcli.stages import evaluate
        transfer = split == TRANSFER
        folder = self.out / "eval" / split
        report_path = folder / f"{name}.json"
        first = self.first.get(split)
        if report_path.exists():
            report = json.loads(report_path.read_text())
            self.first.setdefault(split, (name, report))
            return report
        questions = folder / "questions.parquet"
        ecfg = dataclasses.replace(self.eval, model=model,
                                   search=self.cfg.transfer_search if transfer else self.eval.search)
        table_path = folder / f"{name}.parquet"
        self.rollout_stage(evaluate.rollout_config(ecfg), questions, table_path)
        # the eval stage's own report, from the same rollout settings `atom eval` uses
        report = evaluate.finish_report(self.read(table_path), ecfg, self.ctx, rolled_out=True)
        report.update({"name": name, "model": model})
        vs = ""
        if first is not None and "per_question" in first[1]:
            from atomcli.stages import compare
            report["compare"] = compare.compare_reports(report, first[1], baseline_name=first[0], seed=self.cfg.seed)
            vs = f"  (vs {first[0]}: ΔF1 {compare.describe(report['compare']['overall']['f1'])})"
        tableio.write_bytes_atomic(report_path, json.dumps(report, indent=2).encode())
        self.first.setdefault(split, (name, report))
        self.log(f"eval {split + ' ' if split else ''}{name}: F1 {report['overall']['f1']:.3f}  "
                 f"EM {report['overall']['em']:.3f}{vs}")
        return report

    def evaluate_transfer(self, name: str, model: str) -> dict | None:
        return self.evaluate(name, model, split=TRANSFER) if self.cfg.transfer_test else None

    def eval_point(self, name: str, model: str) -> None:
        """The test eval of a checkpoint, and its dev eval when the run holds out a dev split
        (a candidate for the final checkpoint)."""
        self.evaluate(name, model)
        if self.cfg.dev_questions:
            self.evaluate(name, model, split=DEV)
            self.candidates.append((name, model))

    def is_eval_point(self, t: int) -> bool:
        """Step t (0-based) is evaluated: every eval_every steps and the last."""
        return t + 1 == self.cfg.steps or bool(self.cfg.eval_every and (t + 1) % self.cfg.eval_every == 0)


def prepare(out: Path, demo: bool, quick: bool, config_file: str | None, context, preset: str = "demo",
            build: bool = True) -> dict:
    """Settings for this run: preset < config file; with --demo, build the world and model
    (`build=False`: only the settings, the same ones, so that they are checked before anything is built)."""
    if preset not in PRESETS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("preset", preset, tuple(PRESETS))
    if quick and not demo:
        raise InputError("--quick only applies with --demo")
    if preset != "demo" and not demo:
        raise InputError(f"--preset {preset} only applies with --demo")
    settings = _merge(PRESETS[preset] if demo and not quick else {}, QUICK if quick else {},
                      cfgmod.load_file(config_file))
    if demo:
        from atomcli import models
        from atomcli.demo import world as demo_world
        world = out / "world"
        ra = settings.setdefault("run-all", {})
        style = ra.get("world_style", RunAllConfig.world_style)
        if style not in demo_world.STYLES:  # before anything is built
            from atomcli.errors import unknown_choice
            raise unknown_choice("world_style", style, demo_world.STYLES)
        # the experts' searches see the snippet order the rollouts will get (`[rollout] search_options`)
        from atomcli import plugins
        from atomcli.env import search_local
        options = plugins.parse_options(settings.get("rollout", {}).get("search_options", ""))
        snippets = options.get(search_local.SNIPPETS, search_local.PAGE_ORDER)
        if build and not (world / "index.sqlite").exists():
            context.log(f"building the demo world ({style})...")
            demo_world.main(str(world), seed=0, context=context, style=style, snippets=snippets,
                            **(QUICK_WORLD if quick else {}))
        ra.setdefault("train", str(world / "train.jsonl"))
        ra.setdefault("test", str(world / "test.jsonl"))
        ra.setdefault("sft_data", str(world / "sft.parquet"))
        ra.setdefault("search", f"local:{world / 'index.sqlite'}")
        if "transfer_test" not in ra:  # transfer to real documents, measured every run
            from atomcli.demo import real_docs
            real = out / "real"
            if build and not (real / "index.sqlite").exists():
                real_docs.build("sqlite", real, context=context)
            ra["transfer_test"] = str(real / "test.jsonl")
            ra["transfer_search"] = f"local:{real / 'index.sqlite'}"
        if quick and "model" not in ra:
            tiny = out / "tiny-model"
            if build and not (tiny / "config.json").exists():
                from atomcli.tableio import atomic_dir
                with atomic_dir(tiny) as tmp:
                    models.make_tiny_model(tmp)
            ra["model"] = str(tiny)
    return settings


def main(*, out: str, config_file: str | None, demo: bool, quick: bool, resume: bool, context,
         preset: str = "demo") -> None:
    from atomcli import tableio
    from atomcli.stages import sft
    from atomcli import safety
    run_dir = Path(out)
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        hint = ("pass --resume to continue it, or a new --out" if safety.is_run_folder(run_dir)
                else "give a new --out: run-all writes into a folder of its own")
        raise InputError("run folder exists and is not empty", file=out, hint=hint)
    safety.check_output(run_dir, safety.RUN)  # --resume adopts only a folder run-all made
    # every setting is checked before anything is built or written: a refused run leaves the
    # folder as it was, so the corrected command works without --resume
    settings = prepare(run_dir, demo, quick, config_file, context, preset, build=False)
    run = Run(run_dir, settings, context)
    cfg = run.cfg
    _check_stage_configs(run)
    if resume:
        _check_same_settings(run_dir, settings)
    if demo:  # the world is built by this run: mark the folder first, so a kill mid-build can --resume
        _mark(run_dir, settings)
        prepare(run_dir, demo, quick, config_file, context, preset)

    # questions: the training set cycles through steps; evals use a fixed slice of the test set
    train = run.read(Path(cfg.train), "rollout")
    test = run.read(Path(cfg.test), "rollout")
    # with dynamic sampling each step draws its reserve questions up front (a pure plan: resume redraws it);
    # planned before the folder is marked: a max_hops that no question meets is refused like a bad input
    per_step = cfg.questions_per_step * (1 + cfg.dynamic_sampling)
    plan = plan_questions(question_hops(train), cfg.steps, per_step, cfg.curriculum, cfg.seed,
                          cfg.curriculum_levels, cfg.max_hops, question_sources(train))
    # the dev split is never a question the SFT data answers (held_out says why)
    seen = sft_rows(train, run.read(Path(cfg.sft_data))) if cfg.dev_questions and cfg.sft_data else frozenset()
    dev_rows = held_out(plan, train.num_rows, cfg.dev_questions, seen)
    if cfg.dev_questions and len(dev_rows) < cfg.dev_questions:
        raise InputError(f"dev_questions = {cfg.dev_questions}, but only {len(dev_rows)} training questions are "
                         f"left once the {cfg.steps} steps and the SFT data ({len(seen)}) have taken theirs",
                         file=cfg.train, hint="lower [run-all] dev_questions, or give more training questions")
    from atomcli.stages import run_rft
    rft_pool = run_rft.pool(train, cfg, exclude=set(dev_rows)) if cfg.rft_rounds else []
    # only once the inputs are known good: a refused run leaves the folder empty, so fixing
    # the input and running the same command again works without --resume
    _mark(run_dir, settings)
    if cfg.eval_limit:
        test = test.slice(0, cfg.eval_limit)
    if not (run_dir / "eval" / "questions.parquet").exists():
        tableio.write_table(test, str(run_dir / "eval" / "questions.parquet"))
    if cfg.transfer_test and not (run_dir / "eval" / TRANSFER / "questions.parquet").exists():
        transfer = run.read(Path(cfg.transfer_test), "rollout")
        if cfg.transfer_limit:
            transfer = transfer.slice(0, cfg.transfer_limit)
        tableio.write_table(transfer, str(run_dir / "eval" / TRANSFER / "questions.parquet"))
    if cfg.dev_questions and not (run_dir / "eval" / DEV / "questions.parquet").exists():
        tableio.write_table(train.take(dev_rows), str(run_dir / "eval" / DEV / "questions.parquet"))

    from atomcli.engines import policy_sync
    model = policy_sync.trainer_model(cfg.model)  # a local checkpoint; a served policy follows it
    if cfg.eval_base:
        (run.evaluate if cfg.sft_data else run.eval_point)("base", model)
        if not cfg.sft_data:
            run.evaluate_transfer("base", model)
    if cfg.sft_data:
        run.train_stage("sft", sft, run.sft, Path(cfg.sft_data), run_dir / "sft")
        model = str(run_dir / "sft")
        run.eval_point("sft", model)
        run.evaluate_transfer("sft", model)
    if cfg.rft_rounds:
        model = run_rft.rounds(run, train, rft_pool, model)
    start = model

    # the policy stays in memory from step to step (Context.resident); checkpoints are written every
    # save_every steps, so a resumed run restarts from the last saved one and redoes the steps after it
    last = _resume_point(run)
    for t in range(cfg.steps):
        d = run.step_dir(t)
        ckpt = d / "ckpt"
        if t + 1 > last or (t + 1 == last and not (d / "metrics.json").exists()):
            run.log(f"[bold]step {t + 1}/{cfg.steps}[/]{_eta(run, t, cfg.steps)}")
            q = cfg.questions_per_step
            picks = list(dict.fromkeys(plan[t]))  # a small pool can wrap: never one question twice a step
            first = _sample_round(run, t, d, model, train.take(picks[:q]))
            batch, counts = first, None
            if cfg.dynamic_sampling:
                batch, counts = _dynamic_batch(run, t, d, model, train, picks, first)
            ckpt_metrics = run.grpo_stage(t, dataclasses.replace(run.grpo, model=model, ref=run.grpo.ref or start),
                                          batch, ckpt)
            # diagnostics of the first round: what the policy did on the step's questions, comparable
            # with runs without dynamic sampling (the kept groups alone would hide the flat ones)
            _log_metrics(run, t, d, first, counts, ckpt_metrics)
        model = str(ckpt)
        if run.is_eval_point(t) and t + 1 < cfg.steps:
            name = f"step-{t + 1:04d}"
            lost = not (ckpt / "config.json").exists() and not (run_dir / "eval" / f"{name}.json").exists()
            if t + 1 < last and lost:
                run.log(f"[yellow]note:[/] eval {name} is missing and its checkpoint was not saved: skipped")
            else:
                run.eval_point(name, model)  # between saves: the in-memory policy
    if cfg.steps:
        run.eval_point(f"step-{cfg.steps:04d}", model)
        if not run.candidates:  # with a dev split the final checkpoint may be another: only its transfer is run
            run.evaluate_transfer(f"step-{cfg.steps:04d}", model)
    if run.candidates:
        name, model = choose_final(run)
        run.evaluate_transfer(name, model)  # the final checkpoint's transfer (cached when it is the last step)

    from atomcli.stages import run_report
    run_report.write(run_dir, context)
    run.log(f"[green]done[/]: {run_dir}/summary.md")


def choose_final(run: Run) -> tuple[str, str]:
    """The eval point with the best dev F1 (ties: the later) is the run's final checkpoint; written
    to final.json with every candidate's dev and test F1. Returns (eval name, checkpoint)."""
    from atomcli import tableio
    scored = []
    for name, model in run.candidates:
        dev = json.loads((run.out / "eval" / DEV / f"{name}.json").read_text())
        test = json.loads((run.out / "eval" / f"{name}.json").read_text())
        scored.append({"name": name, "checkpoint": model, "dev_f1": dev["overall"]["f1"],
                       "test_f1": test["overall"]["f1"]})
    best = max(reversed(range(len(scored))), key=lambda i: scored[i]["dev_f1"])  # reversed: ties -> later
    final = {**scored[best], "rule": "best dev F1 over the eval points (ties: the later)",
             "dev_questions": run.cfg.dev_questions, "candidates": scored}
    tableio.write_bytes_atomic(run.out / FINAL_FILE, json.dumps(final, indent=2).encode())
    run.log(f"final checkpoint: {final['name']} (dev F1 {final['dev_f1']:.3f}; test F1 {final['test_f1']:.3f})")
    return final["name"], final["checkpoint"]


def describe_final(run_dir: Path) -> str | None:
    """The line of summary.md that names the final checkpoint (None: the run chose none)."""
    path = Path(run_dir) / FINAL_FILE
    if not path.exists():
        return None
    final = json.loads(path.read_text())
    return (f"Final checkpoint: **{final['name']}** (`{final['checkpoint']}`): the best dev F1 "
            f"({final['dev_f1']:.3f}) of {len(final['candidates'])} eval points on {final['dev_questions']} "
            f"held-out training questions; its test F1 is {final['test_f1']:.3f}.")


def _resume_point(run: Run) -> int:
    """The last step (1-based) whose checkpoint is saved (0: none). The steps after it are redone: the
    next one keeps its tables (made by the saved policy) but not its metrics; later ones go whole, their
    tables were made by policies that were only in memory."""
    import shutil
    steps = run.out / "steps"
    if not steps.is_dir():
        return 0
    done = [int(p.parent.parent.name) for p in steps.glob("[0-9][0-9][0-9][0-9]/ckpt/config.json")]
    last = max([n for n in done if n <= run.cfg.steps], default=0)
    for p in sorted(steps.glob("[0-9][0-9][0-9][0-9]")):
        n = int(p.name)
        if n == last + 1:
            (p / "metrics.json").unlink(missing_ok=True)
        elif n > last + 1:
            run.log(f"resume: redoing step {n} (its checkpoint was not saved)")
            shutil.rmtree(p)
    return last


def _sample_round(run: Run, t: int, folder: Path, model: str, questions) -> Path:
    """rollout -> score -> aggregate-reward for one set of questions in `folder`; the rewarded table."""
    from atomcli import tableio
    from atomcli.stages import aggregate_reward, score_ig, score_rrm
    if not (folder / "questions.parquet").exists():
        tableio.write_table(questions, str(folder / "questions.parquet"))
    run.rollout_stage(dataclasses.replace(run.rollout, model=model, seed=run.cfg.seed + t),
                      folder / "questions.parquet", folder / "rollouts.parquet")
    if run.aggregate.process == "ig":  # information gain under the policy that made the rollouts
        run.table_stage("score-ig", score_ig, dataclasses.replace(run.ig, model=run.ig.model or model),
                        folder / "rollouts.parquet", folder / "scored.parquet")
    else:
        run.table_stage("score-rrm", score_rrm, run.score, folder / "rollouts.parquet", folder / "scored.parquet")
    run.table_stage("aggregate-reward", aggregate_reward,
                    dataclasses.replace(run.aggregate, step=t, total_steps=run.cfg.steps),
                    folder / "scored.parquet", folder / "rewarded.parquet")
    return folder / "rewarded.parquet"


def groups_with_signal(table) -> list:
    """Group ids, in order, with at least one nonzero advantage (or turn advantage): the groups a
    GRPO update learns from; the others contribute nothing to the gradient."""
    adv = table.column("advantage").to_pylist()
    turn = table.column("turn_advantages").to_pylist() if "turn_advantages" in table.column_names else None
    out: list = []
    for i, g in enumerate(table.column("group_id").to_pylist()):
        if g not in out and (adv[i] != 0 or (turn is not None and any(x != 0 for x in turn[i] or []))):
            out.append(g)
    return out


def _dynamic_batch(run: Run, t: int, d: Path, model: str, train, picks: list[int], first: Path):
    """DAPO's dynamic sampling: roll out more of the step's reserve questions until `questions_per_step`
    groups have signal (or the rounds run out); the kept groups are written to selected.parquet.
    Returns (the table to train on, (groups rolled out, groups kept))."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from atomcli import tableio
    out = d / "selected.parquet"
    q, rounds = run.cfg.questions_per_step, [first]
    while True:  # every round is resumable: a rerun re-reads the rounds it finds
        tables = [run.read(p) for p in rounds]
        kept = [(r, g) for r, tb in enumerate(tables) for g in groups_with_signal(tb)]  # (round, group):
        # two rounds may reuse a group id (a question id repeated in the train file)
        r = len(rounds)
        more = picks[r * q:(r + 1) * q]
        if len(kept) >= q or r > run.cfg.dynamic_sampling or not more:
            break
        run.log(f"dynamic sampling: {len(kept)} of {q} groups with signal; round {r + 1}")
        folder = d / f"round-{r + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        rounds.append(_sample_round(run, t, folder, model, train.take(more)))
    sampled = sum(len(set(tb.column("group_id").to_pylist())) for tb in tables)
    keep = kept[:q]
    if not keep:  # nothing has signal: train on the first round (every row is skipped or zero)
        return first, (sampled, 0)
    if not out.exists():
        parts = [tb.filter(pc.is_in(tb.column("group_id"), pa.array([g for r, g in keep if r == k],
                                                                     type=tb.schema.field("group_id").type)))
                 for k, tb in enumerate(tables)]
        tableio.write_table(pa.concat_tables(parts, promote_options="default"), str(out))
    return out, (sampled, len(keep))


def _check_stage_configs(run: Run) -> None:
    """Each stage's own range checks, now rather than when the stage first runs (after SFT, steps later)."""
    from atomcli.stages import grpo_step, rollout, score_rrm, sft
    rollout.validate(run.rollout)
    score_rrm._validate(run.score)
    grpo_step._check_config(run.grpo)
    from atomcli.stages import rft
    rft.check(run.rft)
    if run.cfg.sft_data:
        sft._check_config(run.sft)


def _mark(run_dir: Path, settings: dict) -> None:
    """The run folder's marker (safety.RUN_MARKER: made by run-all) and its config.json."""
    from atomcli import __version__, safety, tableio
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / safety.RUN_MARKER).exists():
        tableio.write_bytes_atomic(run_dir / safety.RUN_MARKER, json.dumps(
            {"made_by": "atom run-all", "format": 1, "version": __version__}).encode())
    tableio.write_bytes_atomic(run_dir / "config.json", json.dumps(settings, indent=2).encode())


def _check_same_settings(run_dir: Path, settings: dict) -> None:
    """--resume continues the run it finds: the same settings (config.json), or a refusal naming the change."""
    from atomcli import safety
    path = run_dir / "config.json"
    if not path.is_file():
        return  # an empty folder, or a demo run killed before its inputs were read: nothing recorded yet
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"cannot resume: unreadable config.json ({e})", file=str(path),
                         hint="start a new --out") from None
    new = json.loads(json.dumps(settings))
    # a [run-all] setting the record lacks but this run sets to its default (a setting added to atomcli after the
    # run started, turned off in --config, such as a preset's rft_soup) changes nothing the run did
    recorded = old.setdefault("run-all", {}) if isinstance(old, dict) else {}
    defaults = {f.name: f.default for f in dataclasses.fields(RunAllConfig) if f.default is not dataclasses.MISSING}
    for key, value in new.get("run-all", {}).items():
        if key not in recorded and key in defaults and value == defaults[key]:
            recorded[key] = value
    diffs = safety.config_diff(old, new)
    if diffs:
        raise InputError(f"cannot resume: the run was started with other settings ({safety.describe_diff(diffs)})",
                         file=str(path), hint="resume with the settings it started with (they are in this "
                                              "config.json; a setting shown as (unset) is set to its default in "
                                              "--config), or start a new --out")


def _eta(run: Run, t: int, steps: int) -> str:
    """Remaining time from the mean duration of the steps this process has finished."""
    now = time.time()
    if run.step_start is not None:
        run.step_times.append(now - run.step_start)
    run.step_start = now
    done = run.step_times
    if not done:
        return ""
    return f"  (ETA {sum(done) / len(done) * (steps - t) / 60:.1f} min + final eval)"


def _log_metrics(run: Run, t: int, d: Path, first: Path, counts: tuple[int, int] | None = None,
                 ckpt_metrics: dict | None = None) -> None:
    """One line of metrics.jsonl per step, from the step's (first) rewarded table and the update's
    metrics (`counts`: groups rolled out and kept, with dynamic sampling)."""
    from atomcli import tableio
    from atomcli.stages import step_metrics as sm
    rewarded = run.read(first).to_pydict()
    ckpt_metrics = ckpt_metrics or {}
    line = sm.step_line(t + 1, rewarded, ckpt_metrics)
    if counts is not None:
        line[sm.SAMPLED_GROUPS], line[sm.KEPT_GROUPS] = counts
    line[sm.TIME_MIN] = (time.time() - run.t0) / 60
    tableio.write_bytes_atomic(d / "metrics.json", json.dumps(line).encode())
    # metrics.jsonl is rebuilt from the step folders, so a kill between writes never loses a line
    lines = [json.loads(p.read_text()) for p in sorted((run.out / "steps").glob("*/metrics.json"))]
    tableio.write_bytes_atomic(run.out / "metrics.jsonl", b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    fmt = lambda k: "-" if line.get(k) is None else f"{line[k]:.3f}"  # noqa: E731
    run.log(f"step {t + 1}: reward {fmt(sm.REWARD_MEAN)} ± {fmt(sm.REWARD_STD)}  f1 {fmt(sm.F1)}  "
            f"atr {fmt(sm.ATR)}  alpha {fmt(sm.ALPHA)}  zero-var groups {fmt(sm.ZERO_VAR_GROUPS)}  "
            f"kl {fmt(sm.KL)}  entropy {fmt(sm.ENTROPY)}  grad {fmt(sm.GRAD_NORM)}")
