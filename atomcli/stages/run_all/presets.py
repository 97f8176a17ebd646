"""run-all's presets: canned runs on the embedded demo world, as data (stage sections as a TOML file gives them).

`atom run-all --preset NAME` builds the demo world (and, for `quick`, a tiny random model), then runs the
sections below; a `--config` file is layered on top. examples/<name>.toml is each preset written out by
`preset_toml` (a test checks they agree). `resolve` maps the old `--demo` / `--quick` spellings onto a preset.
"""

from __future__ import annotations

import json

from atomcli.errors import InputError

# The tour: SFT, then one GRPO step (rollout -> score-rrm -> aggregate-reward -> grpo-step), with evals.
DEMO = {
    # Sized from measured rates on 2 CPU cores to finish in well under an hour (bench/RESULTS.md).
    # A 135M model needs ~190 tokens for one expert-style turn: a smaller cap cuts tool calls.
    "run-all": {"steps": 1, "questions_per_step": 2, "eval_limit": 20, "judge": "heuristic", "transfer_limit": 10},
    # Rows one at a time, accumulated to 4: the same update as batches of 4 (the loss is normalised over the
    # accumulated tokens) with a quarter of the activations; gradient checkpointing keeps one layer's activations
    # instead of thirty (the same losses, a recomputed forward), so the tour fits a 16 GB laptop. fp32 throughout:
    # bf16 autocast made this short SFT a worse agent (bench/RESULTS.md).
    "sft": {"max_steps": 14, "lr": 3e-4, "batch_size": 1, "grad_accum": 4, "max_length": 2048, "warmup_ratio": 0.1,
            "gradient_checkpointing": True},
    "rollout": {"group_size": 4, "max_turns": 4, "max_new_tokens": 192, "k": 3, "temperature": 1.0,
                "batch_size": 32, "date": "2026-01-01"},
    "aggregate-reward": {},
    "grpo-step": {"lr": 5e-6, "beta": 0.0, "micro_batch": 4, "gradient_checkpointing": True},
    "eval": {"max_turns": 4, "max_new_tokens": 192},
}
# The learning study's recipe: a longer SFT on the stepwise world (its expert restates the question after each
# fact instead of announcing a hop count, so the SFT policy's plans follow the question), then one
# rejection-sampling round (steps = 0: GRPO steps moved this policy by less than the draw; the GRPO settings
# below apply when a config sets steps: balanced 1- and 2-hop questions, samples at 0.7, a sample cut by the turn
# cap ranked as a wrong answer, information gain with per-turn credit). Every eval answers at the turn cap
# (force_answer), so an eval scores answers rather than how often a policy runs out of turns. 50 held-out
# training questions (dev_questions) choose the final checkpoint without looking at the test split.
LEARN = {
    "run-all": {"steps": 0, "questions_per_step": 8, "eval_limit": 0, "eval_every": 4, "eval_base": False,
                "judge": "heuristic", "curriculum": "balanced", "max_hops": 2, "world_style": "stepwise",
                "dev_questions": 50, "rft_rounds": 1, "rft_sources": "demo", "rft_group_size": 1},
    # batches of 2 accumulated to 4: the settings its results were measured with
    "sft": {**DEMO["sft"], "batch_size": 2, "grad_accum": 2, "max_steps": 40, "precision": "bf16",
            "gradient_checkpointing": False},
    "rollout": {**DEMO["rollout"], "group_size": 8, "temperature": 0.7, "precision": "bf16", "batch_size": 50},
    "aggregate-reward": {"truncated": "fail", "process": "ig", "credit": "turn", "schedule": "constant"},
    "score-ig": {"precision": "bf16"},
    "grpo-step": {"lr": 2e-5, "beta": 0.0, "micro_batch": 4, "gradient_checkpointing": False, "precision": "bf16"},
    "eval": {**DEMO["eval"], "last_turn_note": True, "force_answer": True},
}
# An agent for real documents: the stepwise-real world (the demo world plus the SQLite benchmark's passages,
# training questions and expert trajectories) with snippets led by the sentences holding the query's words, one
# SFT epoch, then two rejection-sampling rounds on the real training questions with two samples a question (one
# sample kept too few multi-search answers), and the rounds' checkpoints averaged (rft_soup) as the final
# checkpoint. No GRPO steps: from this SFT they moved the transfer score by less than the draw. The eval points
# are the SFT and the soup: a round's own eval would cost as much as the soup's and choose nothing.
REAL = {
    "run-all": {"steps": 0, "eval_limit": 50, "eval_base": False, "world_style": "stepwise-real",
                "rft_rounds": 2, "rft_group_size": 2, "rft_sources": "sqlite", "rft_lr": 1e-4, "rft_soup": True,
                "rft_eval_rounds": False},
    "sft": {**DEMO["sft"], "batch_size": 2, "grad_accum": 2, "max_steps": 0, "epochs": 1.0, "lr": 2e-4,
            "precision": "bf16", "sampling": "length", "gradient_checkpointing": False},
    "rollout": {**DEMO["rollout"], "group_size": 8, "temperature": 0.7, "precision": "bf16", "batch_size": 50,
                "search_options": "snippets=query"},
    "rft": {"min_f1": 1.0, "per_question": 1},
    "eval": {**DEMO["eval"], "last_turn_note": True, "force_answer": True},
}
# The CI smoke test: a tiny random model on a small world; it checks the plumbing and learns nothing.
QUICK = {
    "run-all": {"steps": 2, "questions_per_step": 2, "eval_limit": 4, "judge": "heuristic", "transfer_limit": 2},
    "sft": {"epochs": 1.0, "lr": 1e-3, "batch_size": 2, "max_length": 1024, "gradient_checkpointing": False},
    "rollout": {"group_size": 2, "max_turns": 2, "max_new_tokens": 16, "k": 2, "batch_size": 8,
                "date": "2026-01-01"},
    "aggregate-reward": {},
    "grpo-step": {"lr": 1e-4, "beta": 0.0, "micro_batch": 2, "gradient_checkpointing": False},
    "eval": {"max_turns": 2, "max_new_tokens": 16},
}
QUICK_WORLD = {"articles": 120, "train": 12, "test": 4, "sft": 6}  # the quick preset's world sizes

PRESETS = {"demo": DEMO, "quick": QUICK, "learn": LEARN, "real": REAL}
WRITTEN_OUT = ("demo", "learn", "real")  # examples/<name>.toml (quick's tiny model cannot be written as TOML)
# What each preset runs, read off the sections above (the --preset help; tests check the facts they name).
PRESET_HELP = {
    "demo": "the tour of the whole pipeline: SmolLM2-135M, a 14-step SFT on the demo world, then one GRPO step "
            "(rollout, score-rrm, aggregate-reward, grpo-step) of 2 questions x 4 samples; evals before and after "
            "on 20 test and 10 real-document questions",
    "quick": "the CI smoke test: a tiny random model on a small world, a one-epoch SFT and 2 GRPO steps; checks "
             "the plumbing, learns nothing",
    "learn": "the stepwise world, a 40-step SFT, then one rejection-sampling round (one sample to each demo "
             "training question, the right ones kept, the SFT checkpoint tuned one epoch on them); no GRPO steps; "
             "evals on every test question, 50 held-out training questions choose the final checkpoint",
    "real": "an agent for real documents: the stepwise-real world, one SFT epoch, two rejection-sampling rounds "
            "on the SQLite benchmark's training questions (2 samples each), the rounds' checkpoints averaged; no "
            "GRPO steps; evals of the SFT and the soup; several hours on 2 CPU cores",
}


def preset_help() -> str:
    """The --preset option's help: each preset and what it runs."""
    return "A canned run on the embedded demo world (built in --out): " + "; ".join(
        f"`{name}`: {text}" for name, text in PRESET_HELP.items()) + "."


def resolve(preset: str | None, demo: bool, quick: bool) -> tuple[str | None, tuple[str, str] | None]:
    """The preset a command line names, and (old spelling, new spelling) when it used an old one.
    `--demo` alone is `--preset demo`, `--demo --quick` (or `--quick`) is `--preset quick`, `--demo --preset X`
    is `--preset X`; a combination that names two different runs is refused."""
    if preset is not None and preset not in PRESETS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("preset", preset, tuple(PRESETS))
    if not demo and not quick:
        return preset, None
    old = "--demo --quick" if demo and quick else ("--quick" if quick else "--demo")
    legacy = "quick" if quick else "demo"
    if preset is None:
        return legacy, (old, f"--preset {legacy}")
    if quick and preset != "quick":
        raise InputError(f"--quick contradicts --preset {preset}",
                         hint=f"--preset quick is the smoke test; --preset {preset} alone is the {preset} run")
    return preset, (f"{old} --preset {preset}", f"--preset {preset}")


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
    import textwrap
    return to_toml(PRESETS[name], [
        *textwrap.wrap(f"The `{name}` preset of `atom run-all` written out: {PRESET_HELP[name]}.", 110, break_on_hyphens=False),
        f"Generated from atomcli/stages/run_all/presets.py ({name.upper()}); a test checks they agree.",
        f"Copy and edit:  atom run-all --preset {name} --config examples/{name}.toml --out runs/mine"])


def merge(*layers: dict) -> dict:
    """Settings layered section by section: a later layer's keys win."""
    out: dict = {}
    for layer in layers:
        for sec, vals in layer.items():
            if isinstance(vals, dict):
                out.setdefault(sec, {}).update(vals)
            else:
                out[sec] = vals
    return out
