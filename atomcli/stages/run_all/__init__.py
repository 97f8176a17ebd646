"""`atom run-all`: the whole recipe from one command, writing what the piped chain would write.

SFT, then optional rejection-sampling rounds (`rft_rounds`: sample answers, keep the right ones with `atom rft`,
tune the SFT checkpoint on them; with `rft_soup` the rounds' checkpoints averaged), then N GRPO steps of
rollout -> score-rrm -> aggregate-reward (T = step, T_MAX = N) -> grpo-step, with evals before training, after
SFT, after each round, every K steps and at the end. With `[aggregate-reward] process = "ig"`, score-ig takes
score-rrm's place. It calls the same stage functions as the single commands (and writes through the same
`write_stage`), so every table under RUN_DIR equals the one the piped chain makes with the same seeds.

Layout of RUN_DIR (names in layout.py):
    world/, real/, tiny-model/  what a preset builds (the demo world, the real-text benchmark, quick's model)
    sft/                        SFT checkpoint
    rft/01/{questions,rollouts,kept,rows}.parquet, rft/01/ckpt/    each rejection-sampling round
    rft/soup/ckpt/              with rft_soup: the rounds' checkpoints averaged
    steps/0001/{questions,rollouts,scored,rewarded}.parquet, steps/0001/ckpt/
                                with dynamic_sampling: steps/0001/round-2/... and steps/0001/selected.parquet
    eval/{base,sft,rft-01,step-0003}.{parquet,json}, eval/transfer/..., eval/dev/...
    final.json                  with dev_questions: the eval point with the best dev F1 (the final checkpoint)
    metrics.jsonl, plots/*.png, summary.md, config.json, atom_run.json (the marker), .atom_run.lock

The modules: command (main: settings, checks, the world, the order of the stages), config (RunAllConfig and
every check before a run starts), presets (the canned runs, as data), plan (which questions each step draws,
the dev split), folder (the run folder, its lock, resume), runner (Run: a stage into the folder), loop (the GRPO
steps), rft_rounds (the rejection-sampling rounds and the soup), report (summary.md and plots), step_metrics
(the per-step diagnostics).

Resume: every output is written atomically, so a file that exists is complete. `--resume` restarts from the
last step whose checkpoint was saved (later steps are redone), and the final weights equal an uninterrupted
run's. Evals, SFT and rounds that exist are not redone.
"""

from __future__ import annotations

from atomcli.stages.run_all.command import main, prepare
from atomcli.stages.run_all.config import CURRICULA, RunAllConfig
from atomcli.stages.run_all.layout import DEV, FINAL_FILE, TRANSFER
from atomcli.stages.run_all.loop import choose_final, groups_with_signal
from atomcli.stages.run_all.plan import held_out, plan_questions, question_hops, sft_rows
from atomcli.stages.run_all.presets import (DEMO, LEARN, PRESETS, QUICK, QUICK_WORLD, REAL, merge, preset_toml,
                                                to_toml)
from atomcli.stages.run_all.runner import Run

_merge = merge  # the name scripts under bench/ use

__all__ = ["CURRICULA", "DEMO", "DEV", "FINAL_FILE", "LEARN", "PRESETS", "QUICK", "QUICK_WORLD", "REAL", "TRANSFER",
           "Run", "RunAllConfig", "choose_final", "groups_with_signal", "held_out", "main", "merge",
           "plan_questions", "prepare", "preset_toml", "question_hops", "sft_rows", "to_toml"]
