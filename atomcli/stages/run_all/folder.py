"""The run folder: whether --out may be used, its marker and config.json, the lock, and where --resume restarts.

Every output in a run folder is written atomically, so a file that exists is complete. `--resume` continues
only a folder run-all made (its marker) and only with the settings in its config.json (a changed setting is
refused, naming it); a folder that was moved, or is reached through a symlink, is the same run. One process
writes a folder at a time: the second holds no lock and is refused, naming the first one's pid.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from atomcli.errors import InputError
from atomcli.stages.run_all import layout
from atomcli.stages.run_all.config import RunAllConfig

RUN_TOKEN = "<run folder>"  # the run folder's own path inside a recorded setting, wherever the folder is now


def check_out(run_dir: Path, resume: bool) -> None:
    """--out is new, empty, or (with --resume) a folder run-all made; and no other process writes it."""
    from atomcli import safety
    probe_lock(run_dir)
    if run_dir.is_dir() and any(run_dir.iterdir()) and not resume:  # not a folder: check_output says so
        hint = ("pass --resume to continue it, or a new --out" if safety.is_run_folder(run_dir)
                else "give a new --out: run-all writes into a folder of its own")
        raise InputError("run folder exists and is not empty", file=str(run_dir), hint=hint)
    safety.check_output(run_dir, safety.RUN)  # --resume adopts only a folder run-all made


def _holder(path: Path) -> str:
    try:
        pid = path.read_text(encoding="utf-8").strip()
    except OSError:
        pid = ""
    return f"pid {pid}" if pid.isdigit() else "another process"


def probe_lock(run_dir: Path) -> None:
    """Refuse at once when another run-all process holds the folder's lock (before any other check)."""
    import fcntl
    path = run_dir / layout.LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file (a new folder, or one from before the lock): nothing holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        raise InputError(f"another `atom run-all` ({_holder(path)}) is writing this run folder", file=str(run_dir),
                         hint="wait for it to finish (then --resume), or give a new --out") from None
    finally:
        os.close(fd)


def lock(run_dir: Path) -> int:
    """Take the folder's lock for this process (released when the returned descriptor is closed, or the
    process ends, however it ends); refused, naming the holder, when another process has it."""
    import fcntl
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / layout.LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise InputError(f"another `atom run-all` ({_holder(path)}) is writing this run folder", file=str(run_dir),
                         hint="wait for it to finish (then --resume), or give a new --out") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _marker(run_dir: Path) -> dict:
    try:
        record = json.loads((run_dir / layout.MARKER).read_text(encoding="utf-8"))
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def mark(run_dir: Path, settings: dict, *, building: bool = False) -> None:
    """The run folder's marker (made by run-all, and where: a moved or linked folder is recognised on
    --resume) and its config.json. `building`: a preset is about to build the world, and the run's inputs are
    not checked yet: the marker records only the settings the build depends on, and config.json is written
    once the checks pass, so a run refused by them resumes with the corrected settings."""
    from atomcli import __version__, tableio
    run_dir.mkdir(parents=True, exist_ok=True)
    record = _marker(run_dir) or {"made_by": "atom run-all", "format": 1, "version": __version__}
    record = {**record, "folders": _spellings(run_dir)}
    if building:
        record["built_from"] = _built_from(settings)
    tableio.write_bytes_atomic(run_dir / layout.MARKER, json.dumps(record).encode())
    if not building:
        tableio.write_bytes_atomic(run_dir / layout.CONFIG, json.dumps(settings, indent=2).encode())


def _spellings(run_dir: Path) -> list[str]:
    """The ways the settings may spell the run folder: as given, absolute, resolved (longest first)."""
    names = {str(run_dir), os.path.abspath(run_dir), str(Path(run_dir).resolve())}
    return sorted((n for n in names if n not in ("", ".")), key=len, reverse=True)


def _relocated(value, roots: list[str]):
    """`value` with a leading run folder path (in any of its spellings, after an optional `local:`-style
    prefix) written as RUN_TOKEN; lists and dicts recursively."""
    if isinstance(value, dict):
        return {k: _relocated(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [_relocated(v, roots) for v in value]
    if not isinstance(value, str):
        return value
    for root in roots:
        for prefix in ("", *(value[:i + 1] for i, c in enumerate(value[:16]) if c == ":")):
            rest = value[len(prefix):]
            if rest == root or rest.startswith(root.rstrip("/") + "/"):
                return prefix + RUN_TOKEN + rest[len(root):]
    return value


def _recorded_roots(run_dir: Path, old: dict) -> list[str]:
    """Where the recorded run folder was: the marker's record, else inferred from a preset's world paths."""
    roots = _marker(run_dir).get("folders")
    if isinstance(roots, list) and roots:
        return [str(r) for r in roots]
    train = str((old.get("run-all") or {}).get("train", ""))
    tail = f"/{layout.WORLD}/train.jsonl"
    return [train[:-len(tail)]] if train.endswith(tail) else []


def check_same_settings(run_dir: Path, settings: dict) -> None:
    """--resume continues the run it finds: the same settings (config.json), or a refusal naming the change.
    Paths inside the run folder compare by their place in it, so a moved or linked folder is the same run."""
    from atomcli import safety
    path = run_dir / layout.CONFIG
    new = _relocated(json.loads(json.dumps(settings)), _spellings(run_dir))
    if not path.is_file():  # refused by its checks, or killed, before it took its inputs: what it built must match
        built = _marker(run_dir).get("built_from")
        if isinstance(built, dict):
            diffs = safety.config_diff(_relocated(built, _recorded_roots(run_dir, {})), _built_from(new))
            if diffs:
                raise InputError(f"cannot resume: the folder's demo world was built for other settings "
                                 f"({safety.describe_diff(diffs)})", file=str(run_dir),
                                 hint="resume with those settings, or start a new --out")
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"cannot resume: unreadable config.json ({e})", file=str(path),
                         hint="start a new --out") from None
    if not isinstance(old, dict):
        old = {}
    old = _relocated(old, _recorded_roots(run_dir, old))
    # a [run-all] setting the record lacks but this run sets to its default (a setting added to atomcli after the
    # run started, turned off in --config, such as a preset's rft_soup) changes nothing the run did
    recorded = old.setdefault("run-all", {})
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


# The settings that decide what a preset builds in the folder before the run's own checks (the world, the
# real-text benchmark, the tiny model): a run that stopped at those checks may resume with any other change.
BUILT_FROM = {"run-all": ("world_style", "model", "train", "test", "sft_data", "search", "transfer_test",
                          "transfer_search"), "rollout": ("search_options",)}


def _built_from(settings: dict) -> dict:
    return {sec: {k: v for k, v in (settings.get(sec) or {}).items() if k in keys} for sec, keys in BUILT_FROM.items()}


def resume_point(run, log) -> int:
    """The last step (1-based) whose checkpoint is saved (0: none). The steps after it are redone: the
    next one keeps its tables (made by the saved policy) but not its metrics; later ones go whole, their
    tables were made by policies that were only in memory."""
    import shutil
    steps = run.out / layout.STEPS
    if not steps.is_dir():
        return 0
    done = [int(p.parent.parent.name) for p in steps.glob("[0-9][0-9][0-9][0-9]/ckpt/config.json")]
    last = max([n for n in done if n <= run.cfg.steps], default=0)
    for p in sorted(steps.glob("[0-9][0-9][0-9][0-9]")):
        n = int(p.name)
        if n == last + 1:
            (p / "metrics.json").unlink(missing_ok=True)
        elif n > last + 1:
            log(f"resume: redoing step {n} (its checkpoint was not saved)")
            shutil.rmtree(p)
    return last
