"""`atom eval --run RUN`: evaluate the way a run of `atom run-all` evaluates.

The run records its settings in RUN/config.json and the questions of its evals in
RUN/eval/[SPLIT/]questions.parquet (the test split cut to its `eval_limit`; `--split transfer` the
second test set, searched with its `transfer_search`; `--split dev` the held-out training questions).
`--run` takes from them exactly what run-all's own evals use (run_all.Run): the `[eval]` section, the
`[rollout]` section (k, turns, tokens, date, reader, search options...), the run's search and `seed`,
and the questions; and, as the model, the run's newest checkpoint:

    steps/NNNN/ckpt (the highest step saved) > rft/soup/ckpt > rft/NN/ckpt (the last round) > sft/ >
    the starting model

so that a nightly eval follows a run while it trains, and, once it has finished, scores the checkpoint
of its last eval point (eval/[SPLIT/]<eval_point>.json holds the run's own numbers for it). A run with a dev
split may have chosen another checkpoint as final (final.json): pass `--model` with that path.
These settings lie under `--config`, and flags override both.

A path the run recorded relative to the folder it was started from (`local:runs/demo/world/index.sqlite`)
is found inside RUN when it does not exist from here, so that cron can run from another directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from atomcli.errors import InputError
from atomcli.stages.run_all import layout

QUESTIONS = "questions.parquet"  # run-all writes each split's questions as eval/[SPLIT/]questions.parquet
TEST = "test"
SPLITS = (TEST, layout.TRANSFER, layout.DEV)  # the run's question sets: eval/, eval/transfer/, eval/dev/


def read_settings(run: str) -> dict:
    """RUN/config.json, checked to be a run folder's."""
    from atomcli import safety
    folder = Path(run)
    if not folder.is_dir():
        raise InputError("run folder not found", file=run, hint="give the --out folder of `atom run-all`")
    if not safety.is_run_folder(folder):
        raise InputError("not a run folder made by `atom run-all` (no atom_run.json)", file=run,
                         hint="give the --out folder of `atom run-all`")
    path = folder / layout.CONFIG
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("the run has no config.json yet (it was stopped before its settings were recorded)",
                         file=str(path), hint="evaluate a run that has started its evals") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"unreadable config.json ({e})", file=str(path), hint="give a run folder of `atom run-all`") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("run-all"), dict):
        raise InputError("config.json has no [run-all] settings", file=str(path),
                         hint="give the --out folder of `atom run-all`")
    return settings


def locate(path: str, run: str) -> str:
    """`path` as recorded by the run, found from here: as is when it exists, else the longest tail of it
    that exists inside RUN (the run was started from another directory), else as is."""
    p = Path(path)
    if not path or p.is_absolute() or p.exists():
        return path
    for i in range(1, len(p.parts)):
        candidate = Path(run).joinpath(*p.parts[i:])
        if candidate.exists():
            return str(candidate)
    return path


def _locate_spec(spec: str, run: str) -> str:
    name, sep, rest = spec.partition(":")
    return f"{name}:{locate(rest, run)}" if name == "local" and sep else spec


def newest_checkpoint(run: str, settings: dict) -> tuple[str, str]:
    """(checkpoint, eval point name) of the run's newest saved checkpoint (the module docstring's order)."""
    folder = Path(run)
    # a checkpoint folder is complete once its config.json is there (checkpoint.save renames it into place)
    steps = sorted(p.parent for p in folder.glob(f"{layout.STEPS}/[0-9][0-9][0-9][0-9]/ckpt/config.json"))
    if steps:
        return str(steps[-1]), f"step-{steps[-1].parent.name}"
    soup = folder / layout.RFT_ROOT / layout.SOUP / "ckpt"
    if (soup / "config.json").is_file():
        return str(soup), layout.SOUP_POINT
    rounds = sorted(p.parent for p in folder.glob(f"{layout.RFT_ROOT}/[0-9][0-9]/ckpt/config.json"))
    if rounds:
        return str(rounds[-1]), f"rft-{rounds[-1].parent.name}"
    if (folder / layout.SFT / "config.json").is_file():
        return str(folder / layout.SFT), layout.SFT
    from atomcli.engines import policy_sync
    from atomcli.stages.run_all import RunAllConfig
    model = policy_sync.trainer_model(settings["run-all"].get("model", RunAllConfig.model))
    return (locate(model, run) if "/" in model else model), "base"


def _folder(run: str, split: str) -> Path:
    if split not in SPLITS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("--split", split, SPLITS)
    return Path(run) / layout.EVAL / ("" if split == TEST else split)


def sections(run: str, split: str = TEST) -> dict:
    """The `[eval]` and `[rollout]` settings of the run's evals of `split`, with its search, seed, newest checkpoint."""
    _folder(run, split)
    settings = read_settings(run)
    ra = settings["run-all"]
    key = "transfer_search" if split == layout.TRANSFER else "search"
    if not ra.get(key):
        raise InputError(f"the run records no search SPEC for --split {split} ([run-all] {key})",
                         file=str(Path(run) / layout.CONFIG), hint="pass --search SPEC")
    model, _ = newest_checkpoint(run, settings)
    ev = dict(settings.get("eval") or {})
    # run_all.Run: the [eval] section with the run's search and seed
    ev.update(search=_locate_spec(ra[key], run), seed=ra.get("seed", 0), model=model)
    rollout = dict(settings.get("rollout") or {})
    return {"eval": ev, "rollout": rollout}


def info(run: str, model: str, split: str = TEST) -> dict:
    """What a report records about the run it evaluated: folder, split, checkpoint, the run's eval of that checkpoint."""
    settings = read_settings(run)
    newest, point = newest_checkpoint(run, settings)
    out = {"folder": run, "split": split, "checkpoint": model, "newest": newest,
           "eval_point": point if model == newest else None}
    report = _folder(run, split) / f"{point}.json"
    if out["eval_point"] and report.is_file():
        out["run_eval"] = str(report)
    return out


def questions(run: str, split: str = TEST) -> str:
    path = _folder(run, split) / QUESTIONS
    if not path.is_file():
        if split != TEST:
            raise InputError(f"the run has no questions for --split {split}", file=str(path),
                             hint="a run writes them when it sets transfer_test (transfer) or dev_questions (dev)")
        raise InputError("the run has written no eval questions yet", file=str(path),
                         hint="wait until the run has started, or give the questions file as INPUT")
    return str(path)
