"""run-all's rejection-sampling rounds (`[run-all] rft_rounds`), between the SFT and the GRPO steps.

Round N writes rft/NN/ in the run folder:

    questions.parquet  the training questions of rft_sources that no earlier round solved (never a dev question)
    rollouts.parquet   rft_group_size samples of each, by the latest policy (round 1: the SFT checkpoint)
    kept.parquet       `atom rft` of those: the right, well-formed answers, at most [rft] per_question a question
    rows.parquet       the kept rows of rounds 1..N
    ckpt/              the SFT checkpoint fine-tuned one epoch at rft_lr on rows.parquet

and its checkpoint is an eval point (`rft-NN`: test and dev evals, and transfer when the run has no dev split);
with rft_eval_rounds off only the rounds' result is one (the soup, or the last round without it).
Each round fine-tunes from the SFT checkpoint, not from the last round's, as STaR does: the rows of earlier
rounds are trained once, in one epoch with the new ones, instead of once more every round. The later rounds
sample only what is still unsolved, so they add questions rather than second answers to the easy ones.

With rft_soup, after the last round, rft/soup/ckpt/ is the uniform weight average of the rounds' checkpoints
(atomcli.train.soup), evaluated as `rft-soup` and handed on as the rounds' result (to GRPO steps, when any):
the rounds are siblings tuned from one checkpoint, and their average generalises better than either.
"""

from __future__ import annotations

import dataclasses

from atomcli.errors import InputError
from atomcli.stages.run_all.layout import RFT_ROOT, SOUP, SOUP_POINT

ROOT = RFT_ROOT


def prefixes(rft_sources: str) -> list[str]:
    return [p.strip() for p in rft_sources.split(",") if p.strip()]


def check_sources(cfg, known: list[str]) -> None:
    """Before the training file exists (a preset builds it): every rft_sources prefix must match one of the
    data_source prefixes the preset's world writes (`known`), or the run is refused now."""
    given = prefixes(cfg.rft_sources)
    if not cfg.rft_rounds or not given:
        return
    if not any(k.startswith(p) or p.startswith(k) for p in given for k in known):
        raise InputError(f"rft_sources = {cfg.rft_sources!r} matches no training question of this world",
                         column="data_source",
                         hint=f"its training questions' data_source values start with: {', '.join(known)}")


def pool(train, cfg, exclude: set[int]) -> list[int]:
    """Row indices of the training questions the rounds may sample: those whose data_source starts with one of
    rft_sources (every question when it is empty), less `exclude` (the dev split). Refused when none is left."""
    wanted = prefixes(cfg.rft_sources)
    sources = (train.column("data_source").to_pylist() if "data_source" in train.column_names
               else [None] * train.num_rows)
    rows = [i for i, src in enumerate(sources) if i not in exclude
            and (not wanted or any(str(src or "").startswith(p) for p in wanted))]
    if not rows:
        found = sorted({str(s) for s in sources if s is not None}) or ["none (the file has no data_source)"]
        raise InputError(f"rft_sources = {cfg.rft_sources!r} matches no training question outside the dev split",
                         file=cfg.train, column="data_source",
                         hint=f"the file's data_source values: {', '.join(found[:8])}")
    return rows


def rounds(run, train, rows: list[int], model: str) -> str:
    """Run the rounds from checkpoint `model` (the SFT's); returns the last round's checkpoint, or with
    rft_soup and two rounds or more the average of all of them."""
    import pyarrow as pa

    from atomcli import tableio
    from atomcli.stages import rft, sft
    cfg, start = run.cfg, model
    ids = train.column("id").to_pylist()
    solved: set = set()
    tuned: list[tuple[int, str]] = []  # (round, checkpoint) of each tuned round, for rft_soup
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
        # one epoch in a seeded random order from the SFT checkpoint; the [sft] section's other settings
        tune = dataclasses.replace(run.sft, model=start, lr=cfg.rft_lr, epochs=1.0, max_steps=0, sampling="random")
        run.train_stage("sft", sft, tune, data, d / "ckpt")
        model = str(d / "ckpt")
        if cfg.rft_eval_rounds:
            evaluate_round(run, r, model)
        tuned.append((r, model))
    if cfg.rft_soup and len(tuned) >= 2:
        return soup(run, [m for _, m in tuned])
    if cfg.rft_soup:
        run.log(f"[yellow]rft_soup:[/] {len(tuned)} round checkpoint, nothing to average; going on from {model}")
    if tuned and not cfg.rft_eval_rounds:  # the rounds' result is always an eval point
        evaluate_round(run, *tuned[-1])
    return model


def evaluate_round(run, r: int, model: str) -> None:
    run.eval_point(f"rft-{r:02d}", model)
    if not run.cfg.dev_questions:  # with a dev split only the final checkpoint's transfer is run
        run.evaluate_transfer(f"rft-{r:02d}", model)


def soup(run, tuned: list[str]) -> str:
    """The uniform weight average of the rounds' checkpoints (atomcli.train.soup), written as rft/soup/ckpt and
    evaluated as `rft-soup`; returns it."""
    from atomcli.train import soup as weights
    out = run.out / ROOT / SOUP / "ckpt"
    if not (out / "config.json").exists():
        run.log(f"soup of {len(tuned)} rounds -> {out.relative_to(run.out)}")
        weights.average(tuned, str(out))
    run.eval_point(SOUP_POINT, str(out))
    if not run.cfg.dev_questions:
        run.evaluate_transfer(SOUP_POINT, str(out))
    return str(out)
