"""`atom run-all`'s body: settings, every check, the demo world, then SFT, rounds, steps, evals and the report.

Order matters for a user who has to fix something: every setting and every input that exists is checked
before the folder is locked and marked, the world built or a model loaded, so a refused command leaves
--out as it was and the corrected one runs without --resume.
"""

from __future__ import annotations

from pathlib import Path

from atomcli import config as cfgmod
from atomcli.errors import InputError
from atomcli.stages.run_all import folder, layout, presets
from atomcli.stages.run_all.config import RunAllConfig, check_stage_configs
from atomcli.stages.run_all.runner import Run


def world_sources(style: str) -> list[str]:
    """The data_source prefixes of a demo world's training questions (stepwise-real appends the SQLite
    benchmark's training split to the demo's questions)."""
    return ["demo_"] + (["sqlite_"] if style == "stepwise-real" else [])


def prepare(out: Path, preset: str | None, config_file: str | None, context, build: bool = True) -> dict:
    """Settings for this run: preset < config file; with a preset, the demo world (and for `quick` the tiny
    model) in `out`, built unless `build=False` (only the settings, the same ones, checked before anything is
    built)."""
    if preset is not None and preset not in presets.PRESETS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("preset", preset, tuple(presets.PRESETS))
    settings = presets.merge(presets.PRESETS[preset] if preset else {}, cfgmod.load_file(config_file))
    if preset is None:
        return settings
    quick = preset == "quick"
    from atomcli import models, plugins
    from atomcli.demo import world as demo_world
    from atomcli.env import search_local
    world = out / layout.WORLD
    ra = settings.setdefault("run-all", {})
    style = ra.get("world_style", RunAllConfig.world_style)
    if style not in demo_world.STYLES:  # before anything is built
        from atomcli.errors import unknown_choice
        raise unknown_choice("world_style", style, demo_world.STYLES)
    # the experts' searches see the snippet order the rollouts will get (`[rollout] search_options`)
    options = plugins.parse_options(settings.get("rollout", {}).get("search_options", ""))
    snippets = options.get(search_local.SNIPPETS, search_local.PAGE_ORDER)
    if build and not (world / "index.sqlite").exists():
        context.log(f"building the demo world ({style})...")
        demo_world.main(str(world), seed=0, context=context, style=style, snippets=snippets,
                        **(presets.QUICK_WORLD if quick else {}))
    ra.setdefault("train", str(world / "train.jsonl"))
    ra.setdefault("test", str(world / "test.jsonl"))
    ra.setdefault("sft_data", str(world / "sft.parquet"))
    ra.setdefault("search", f"local:{world / 'index.sqlite'}")
    if "transfer_test" not in ra:  # transfer to real documents, measured every run
        from atomcli.demo import real_docs
        real = out / layout.REAL
        if build and not (real / "index.sqlite").exists():
            real_docs.build("sqlite", real, context=context)
        ra["transfer_test"] = str(real / "test.jsonl")
        ra["transfer_search"] = f"local:{real / 'index.sqlite'}"
    if quick and "model" not in ra:
        tiny = out / layout.TINY_MODEL
        if build and not (tiny / "config.json").exists():
            from atomcli.tableio import atomic_dir
            with atomic_dir(tiny) as tmp:
                models.make_tiny_model(tmp)
        ra["model"] = str(tiny)
    return settings


def main(*, out: str, config_file: str | None, resume: bool, context, preset: str | None = None,
         demo: bool = False, quick: bool = False) -> None:
    """Run the recipe into `out` (`demo` / `quick`: the old spellings of `preset`, with a deprecation line)."""
    preset, old = presets.resolve(preset, demo, quick)
    if old:
        cfgmod.deprecation(*old)
    run_dir = Path(out)
    folder.check_out(run_dir, resume)
    # every setting is checked before anything is built or written: a refused run leaves the
    # folder as it was, so the corrected command works without --resume
    settings = prepare(run_dir, preset, config_file, context, build=False)
    run = Run(run_dir, settings, context)
    check_stage_configs(run)
    if resume:
        folder.check_same_settings(run_dir, settings)
    inputs = None
    if preset is not None and not _inputs_exist(run):
        # the inputs are built by this run: what its training file will hold is known from the world's style
        from atomcli.stages.run_all import rft_rounds
        rft_rounds.check_sources(run.cfg, world_sources(run.cfg.world_style))
    else:
        inputs = _plan(run)  # every input exists: check them all now
    fd = folder.lock(run_dir)
    try:
        if preset is not None:  # the world is built by this run: mark the folder first, so a kill mid-build can --resume
            folder.mark(run_dir, settings, building=True)
            prepare(run_dir, preset, config_file, context)
        _run(run, settings, inputs or _plan(run))
    finally:
        import os
        os.close(fd)


def _inputs_exist(run: Run) -> bool:
    """Whether every input file the settings name exists (a preset's world, benchmark and model are built)."""
    cfg = run.cfg
    paths = [cfg.train, cfg.test, cfg.sft_data, cfg.transfer_test,
             *(spec[len("local:"):] for spec in (cfg.search, cfg.transfer_search) if spec.startswith("local:"))]
    model = Path(cfg.model)
    if run.out in model.parents:  # the quick preset's tiny model
        paths.append(str(model / "config.json"))
    return all(Path(p).exists() for p in paths if p)


def _plan(run):
    """The inputs, read and checked: (train, test, the steps' plan, the dev rows, the rounds' pool)."""
    from atomcli.stages.run_all import plan as planning
    from atomcli.stages.run_all import rft_rounds
    cfg = run.cfg
    train = run.read(Path(cfg.train), "rollout")
    test = run.read(Path(cfg.test), "rollout")
    # with dynamic sampling each step draws its reserve questions up front (a pure plan: resume redraws it)
    per_step = cfg.questions_per_step * (1 + cfg.dynamic_sampling)
    plan = planning.plan_questions(planning.question_hops(train), cfg.steps, per_step, cfg.curriculum, cfg.seed,
                                   cfg.max_hops)
    # the dev split is never a question the SFT data answers (held_out says why)
    seen = (planning.sft_rows(train, run.read(Path(cfg.sft_data))) if cfg.dev_questions and cfg.sft_data
            else frozenset())
    dev_rows = planning.held_out(plan, train.num_rows, cfg.dev_questions, seen)
    if cfg.dev_questions and len(dev_rows) < cfg.dev_questions:
        raise InputError(f"dev_questions = {cfg.dev_questions}, but only {len(dev_rows)} training questions are "
                         f"left once the {cfg.steps} steps and the SFT data ({len(seen)}) have taken theirs",
                         file=cfg.train, hint="lower [run-all] dev_questions, or give more training questions")
    pool = rft_rounds.pool(train, cfg, exclude=set(dev_rows)) if cfg.rft_rounds else []
    if cfg.transfer_test:
        run.read(Path(cfg.transfer_test), "rollout")
    return train, test, plan, dev_rows, pool


def _run(run: Run, settings: dict, inputs: tuple) -> None:
    """The run itself, once the folder is locked (and a preset's world built); `inputs` as `_plan` returns."""
    from atomcli import tableio
    from atomcli.engines import policy_sync
    from atomcli.stages import sft
    from atomcli.stages.run_all import loop, report, rft_rounds
    cfg, run_dir = run.cfg, run.out
    train, test, plan, dev_rows, pool = inputs
    folder.mark(run_dir, settings)
    evals = run_dir / layout.EVAL
    if cfg.eval_limit:
        test = test.slice(0, cfg.eval_limit)
    if not (evals / "questions.parquet").exists():
        tableio.write_table(test, str(evals / "questions.parquet"))
    if cfg.transfer_test and not (evals / layout.TRANSFER / "questions.parquet").exists():
        transfer = run.read(Path(cfg.transfer_test), "rollout")
        if cfg.transfer_limit:
            transfer = transfer.slice(0, cfg.transfer_limit)
        tableio.write_table(transfer, str(evals / layout.TRANSFER / "questions.parquet"))
    if cfg.dev_questions and not (evals / layout.DEV / "questions.parquet").exists():
        tableio.write_table(train.take(dev_rows), str(evals / layout.DEV / "questions.parquet"))

    model = policy_sync.trainer_model(cfg.model)  # a local checkpoint; a served policy follows it
    if cfg.eval_base:
        (run.evaluate if cfg.sft_data else run.eval_point)("base", model)
        if not cfg.sft_data:
            run.evaluate_transfer("base", model)
    if cfg.sft_data:
        run.train_stage("sft", sft, run.sft, Path(cfg.sft_data), run_dir / layout.SFT)
        model = str(run_dir / layout.SFT)
        run.eval_point("sft", model)
        run.evaluate_transfer("sft", model)
    if cfg.rft_rounds:
        model = rft_rounds.rounds(run, train, pool, model)
    # the policy stays in memory from step to step (Context.resident); checkpoints are written every
    # save_every steps, so a resumed run restarts from the last saved one and redoes the steps after it
    model = loop.steps(run, train, plan, model, start=model)
    if run.candidates:
        name, model = loop.choose_final(run)
        run.evaluate_transfer(name, model)  # the final checkpoint's transfer (cached when it is the last step)
    report.write(run_dir)
    run.log(f"[green]done[/]: {run_dir}/{layout.SUMMARY}")
