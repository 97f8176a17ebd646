"""run-all's rejection-sampling rounds (`[run-all] rft_rounds`), between the SFT and the GRPO steps.

Round N writes rft/NN/ in the run folder:

    questions.parquet  the training questions of rft_sources that no earlier round solved (never a dev question)
    rollouts.parquet   rft_group_size samples of each, by the latest policy (round 1: the SFT checkpoint)
    kept.parquet       `atom rft` of those: the right, well-formed answers, at most [rft] per_question a question
    rows.parquet       the kept rows of rounds 1..N
    tune.parquet       with rft_replay: rows.parquet plus a seeded draw of the expert's rows (sft_data)
    ckpt/              the SFT checkpoint fine-tuned one epoch at rft_lr on rows.parquet (tune.parquet with rft_replay)

and its checkpoint is an eval point (`rft-NN`: test and dev evals, and transfer when the run has no dev split). Each round fine-tunes from the SFT
checkpoint, not from the last round's, as STaR does: the rows of earlier rounds are trained once, in one epoch with
the new ones, instead of once more every round. The later rounds sample only what is still unsolved, so they add
questions rather than second answers to the easy ones. Measured (bench/LEARNING.md, sessions 38-40): from the
stepwise-real SFT on the SQLite benchmark's 484 training questions, round 1 kept 179 answers and round 2 71 more;
transfer 0.248 -> 0.273 -> 0.300.

With rft_soup, after the last round, rft/soup/ckpt/ is the uniform weight average of the rounds' checkpoints
(atomcli.train.soup), evaluated as `rft-soup` and handed on as the rounds' result (to GRPO steps, when any).
Measured (session 46, the real preset): transfer 0.271 / 0.274 for seed 0's rounds, 0.304 for their average;
0.230 / 0.274 and 0.314 with seed 1.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pyarrow as pa

from atomcli import schema
from atomcli.errors import InputError

ROOT = "rft"  # the rounds' folder in the run folder
SOUP, SOUP_POINT = "soup", "rft-soup"  # with rft_soup: rft/soup/ckpt, evaluated as eval/rft-soup.json


def pool(train, cfg, exclude: set[int]) -> list[int]:
    """Row indices of the training questions the rounds may sample: those whose data_source starts with one of
    rft_sources (every question when it is empty), less `exclude` (the dev split). Refused when none is left."""
    prefixes = [p.strip() for p in cfg.rft_sources.split(",") if p.strip()]
    sources = (train.column("data_source").to_pylist() if "data_source" in train.column_names
               else [None] * train.num_rows)
    rows = [i for i, src in enumerate(sources) if i not in exclude
            and (not prefixes or any(str(src or "").startswith(p) for p in prefixes))]
    if not rows:
        found = sorted({str(s) for s in sources if s is not None}) or ["none (the file has no data_source)"]
        raise InputError(f"rft_sources = {cfg.rft_sources!r} matches no training question outside the dev split",
                         file=cfg.train, column="data_source",
                         hint=f"the file's data_source values: {', '.join(found[:8])}")
    return rows


def replay(kept, expert, ratio: float, seed: int):
    """The kept rows followed by floor(ratio * kept + 0.5) of the expert's rows (at most all), drawn without repeats
    in a seeded order, with a provenance record of the draw. The expert's rows keep `messages` (atom sft renders
    them; the kept rows train on their token columns) and those of id, traj_id, data_source whose type matches."""
    n = min(math.floor(ratio * kept.num_rows + 0.5), expert.num_rows)
    drawn = expert.take(pa.array(sorted(random.Random(seed).sample(range(expert.num_rows), n)), type=pa.int64()))
    cols = [c for c in ("id", "traj_id", "data_source") if c in drawn.column_names
            and c in kept.column_names and drawn.schema.field(c).type == kept.schema.field(c).type]
    # read_table gives both tables the contract's `messages` type, so the columns concatenate as they are
    mixed = pa.concat_tables([kept, drawn.select(cols + ["messages"])], promote_options="default")
    return schema.with_provenance(mixed, "rft-replay", extra={"ratio": ratio, "seed": seed, "kept": kept.num_rows,
                                                               "expert_rows": expert.num_rows, "drawn": n})


def rounds(run, train, rows: list[int], model: str) -> str:
    """Run the rounds from checkpoint `model` (the SFT's); returns the last round's checkpoint, or with
    rft_soup and two rounds or more the average of all of them."""
    from atomcli import tableio
    from atomcli.stages import rft, sft
    cfg, start = run.cfg, model
    ids = train.column("id").to_pylist()
    solved: set = set()
    tuned: list[str] = []  # the rounds' checkpoints, for rft_soup
    for r in range(1, cfg.rft_rounds + 1):
        d = run.out / ROOT / f"{r:02d}"
        questions, rollouts, kept = d / "questions.parquet", d / "rollouts.parquet", d / "kept.parquet"
        if not questions.exists():
            left = [i for i in rows if ids[i] not in solved]
            if not left:
                run.log(f"rft round {r}: every question is solved; no more rounds")
                break
            d.mkdir(parents=True, exist_ok=True)
            tableio.write_table(train.take(left), str(questions))
        run.log(f"[bold]rft round {r}/{cfg.rft_rounds}[/]")
        run.rollout_stage(dataclasses.replace(run.rollout, model=model, group_size=cfg.rft_group_size,
                                              seed=cfg.seed + r - 1), questions, rollouts)
        try:
            run.table_stage("rft", rft, run.rft, rollouts, kept)
        except rft.NothingKept as e:  # nothing answered right: a result of the round, not a fault of the input
            run.log(f"[yellow]rft round {r}:[/] {e.what}; no more rounds")
            break
        solved |= set(run.read(kept).column("id").to_pylist())
        data = d / "rows.parquet"
        if not data.exists():
            tables = [run.read(run.out / ROOT / f"{k:02d}" / "kept.parquet") for k in range(1, r + 1)]
            tableio.write_table(pa.concat_tables(tables, promote_options="default"), str(data))
        if cfg.rft_replay > 0:
            mixed = d / "tune.parquet"
            if not mixed.exists():
                expert = run.read(Path(cfg.sft_data), "sft")
                tableio.write_table(replay(run.read(data), expert, cfg.rft_replay, seed=cfg.seed + r - 1), str(mixed))
            data = mixed
        # one epoch in a seeded random order, as measured (sessions 38-40); the [sft] section's other settings
        tune = dataclasses.replace(run.sft, model=start, lr=cfg.rft_lr, epochs=1.0, max_steps=0, sampling="random")
        run.train_stage("sft", sft, tune, data, d / "ckpt")
        model = str(d / "ckpt")
        run.eval_point(f"rft-{r:02d}", model)
        if not cfg.dev_questions:  # with a dev split only the final checkpoint's transfer is run (run_all.main)
            run.evaluate_transfer(f"rft-{r:02d}", model)
        tuned.append(model)
    if cfg.rft_soup and len(tuned) >= 2:
        model = soup(run, tuned)
    elif cfg.rft_soup:
        run.log(f"[yellow]rft_soup:[/] {len(tuned)} round checkpoint, nothing to average; going on from {model}")
    return model


def soup(run, tuned: list[str]) -> str:
    """The uniform weight average of the rounds' checkpoints (atomcli.train.soup), written as rft/soup/ckpt and
    evaluated as `rft-soup`; returns it. Every round tunes the SFT checkpoint, so the rounds are siblings from one
    init: session 46 measured their average above either round on the real questions."""
    from atomcli.train import soup as weights
    out = run.out / ROOT / SOUP / "ckpt"
    if not (out / "config.json").exists():
        run.log(f"soup of {len(tuned)} rounds -> {out.relative_to(run.out)}")
        weights.average(tuned, str(out))
    run.eval_point(SOUP_POINT, str(out))
    if not run.cfg.dev_questions:
        run.evaluate_transfer(SOUP_POINT, str(out))
    return str(out)
