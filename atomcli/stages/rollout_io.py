"""Files around a rollout: completed groups persisted as they finish, `--resume`, atomic finish.

While `atom rollout ... --out OUT` runs, every completed group is written at once as a
small Parquet file in `.OUT.partial/` next to OUT (each file itself written atomically).
On success the partial rows, any rows kept from an earlier OUT and the new rows are
concatenated in question order, stamped with provenance, written to OUT atomically, and
the partial folder is removed. A crash or Ctrl-C leaves OUT untouched (or absent) and the
completed groups in the partial folder; `--resume` skips the groups found there and in an
existing OUT. A resume continues exactly the run it finds or refuses, saying what differs:
the rows must be for questions of the current input with the same question text and golden
answers (ids such as FlashRAG's `test_0` repeat across benchmarks), made by the same policy
with the same settings (those in RESUME_FREE excepted), as recorded in OUT's provenance and in
the partial folder's `run.json`. Without `--resume` a leftover partial folder is discarded
(only if it holds nothing but what a rollout writes). Shards
(`--shard i/n`) are independent runs with their own OUT; their outputs concatenate.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa

from atomcli import safety, schema, tableio
from atomcli.errors import InputError

MARKER = "run.json"  # in the partial folder: who made it, and the config of the run it belongs to
_OURS = re.compile(r"(\d{6}\.parquet|\..*\.tmp|run\.json)")
# Settings that change how fast a rollout runs or where it looks things up, not what a trajectory
# is: a resume may change them. Every other setting must match the run being resumed.
RESUME_FREE = ("batch_size", "concurrency", "timeout", "retries", "cache", "replay", "device", "reuse_kv",
               "trust_remote_code", "allow_hosts", "limit", "shard")


def partial_dir(out: str) -> Path:
    p = Path(out)
    return p.parent / f".{p.name}.partial"


class GroupSink:
    """Writes each completed group as `NNNNNN.parquet` in the partial folder.

    The folder (and its marker, naming the run's config) is made with the first group, so a
    rollout refused or failed before any group finished leaves no empty folder behind."""

    def __init__(self, folder: Path, start: int = 0, marker: dict | None = None):
        self.folder, self.count, self.marker = folder, start, marker

    def __call__(self, group: pa.Table) -> None:
        if not self.folder.is_dir():
            self.folder.mkdir(parents=True, exist_ok=True)
        if self.marker is not None and not (self.folder / MARKER).exists():
            tableio.write_bytes_atomic(self.folder / MARKER, json.dumps(self.marker, indent=1).encode())
        self.count += 1
        tableio.write_bytes_atomic(self.folder / f"{self.count:06d}.parquet", tableio.table_bytes(group, "parquet"))


def identity(config) -> dict:
    """The settings that make a rollout what it is (see RESUME_FREE), as provenance records them."""
    values = schema._jsonable(config)
    return {k: v for k, v in values.items() if k not in RESUME_FREE}


def _recorded_identity(recorded: dict, config) -> dict:
    """A recorded config, with settings added since it was written taken at their defaults."""
    defaults = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())
                for f in dataclasses.fields(config)}
    full = {**schema._jsonable(defaults), **recorded}
    return {k: v for k, v in full.items() if k not in RESUME_FREE and k in defaults}


def _is_ours(folder: Path) -> bool:
    return folder.is_dir() and all(_OURS.fullmatch(f.name) for f in folder.iterdir())


def _drop_if_empty(folder: Path) -> None:
    """Remove a partial folder that holds no finished group (a refused or failed run made it)."""
    if _is_ours(folder) and not any(folder.glob("*.parquet")):
        shutil.rmtree(folder, ignore_errors=True)


def read_done(out: str, policy: str, config=None, table: pa.Table | None = None, group_ids=None) -> list[pa.Table]:
    """Rows already made: an existing OUT, then the partial folder's groups.

    With `config`, `table` and `group_ids` (what this run would make), the rows must belong to
    exactly this run: the same policy and settings, and questions that are in `table` with the
    same content (ids like FlashRAG's `test_0` repeat across benchmarks); else InputError."""
    found: list[tuple[str, pa.Table, dict | None]] = []  # (where, rows, recorded config)
    if Path(out).exists():
        t = tableio.read_table(out)
        recs = [r for r in schema.provenance(t) if r.get("stage") == "rollout"]
        found.append((out, t, recs[-1].get("config") if recs else None))
    folder = partial_dir(out)
    if folder.is_dir():
        if not _is_ours(folder):
            raise InputError("cannot resume: holds files a rollout does not write", file=str(folder),
                             hint="move them away, or use another --out")
        marker = None
        if (folder / MARKER).is_file():
            try:
                marker = json.loads((folder / MARKER).read_text(encoding="utf-8")).get("config")
            except (ValueError, AttributeError):
                marker = None
        for f in sorted(folder.glob("*.parquet")):
            found.append((f"{folder} (unfinished groups)", tableio.read_table(str(f)), marker))
    tables = []
    for where, t, recorded in found:
        if t.num_rows == 0:
            continue
        if "group_id" not in t.column_names or "policy" not in t.column_names:
            raise InputError("cannot resume: not a rollout table", file=out, hint="drop --resume to start over")
        policies = set(t.column("policy").to_pylist())
        if policies - {policy}:
            raise InputError(f"cannot resume: rows were made by policy {sorted(policies - {policy})[0]!r}, "
                             f"not {policy!r}", file=out, hint="drop --resume to start over, or use another --out")
        if config is not None and isinstance(recorded, dict):
            diffs = safety.config_diff(_recorded_identity(recorded, config), identity(config))
            if diffs:
                raise InputError(f"cannot resume: {where} was made with other settings ({safety.describe_diff(diffs)})",
                                 file=out, hint="resume with the settings the run started with, or drop --resume "
                                                "/ use another --out")
        if table is not None and group_ids is not None:
            _check_same_questions(t, table, group_ids, where, out)
        tables.append(t)
    return tables


QUESTION_COLUMNS = ("question", "golden_answers")


def _check_same_questions(done: pa.Table, table: pa.Table, group_ids: list[str], where: str, out: str) -> None:
    """Every done row is for a question of `table`, whose question and golden answers it carries."""
    row_of = {g: i for i, g in enumerate(group_ids)}
    cols = [c for c in QUESTION_COLUMNS if c in table.column_names and c in done.column_names]
    mine = {c: table.column(c).to_pylist() for c in cols}
    theirs = {c: done.column(c).to_pylist() for c in cols}
    hint = "resume with the question file the run started with, or drop --resume / use another --out"
    for r, g in enumerate(done.column("group_id").to_pylist()):
        i = row_of.get(g)
        if i is None:
            raise InputError(f"cannot resume: {where} holds rows for question `{g}`, which is not in the "
                             "question file", file=out, hint=hint)
        for c in cols:
            if theirs[c][r] != mine[c][i]:
                raise InputError(f"cannot resume: question `{g}` has another `{c}` in {where} than in the question "
                                 "file (ids such as `test_0` repeat across benchmarks)", file=out, hint=hint)


def run_to_file(mod, table: pa.Table, cfg, ctx, *, out: str, fmt: str | None, resume: bool,
                inputs=()) -> pa.Table:
    """Run the rollout stage `mod` on `table` and write OUT (see the module docstring).

    `inputs`: the paths the table came from (OUT may not be one of them)."""
    tableio.out_format(out, fmt)  # a bad --format fails before any work
    safety.check_output(out, inputs=inputs)  # never over the questions, never an existing folder
    mod.validate(cfg)
    from atomcli.schema import missing_golden
    if "golden_answers" in table.column_names:
        missing_golden(table, ctx, "rollout", "their trajectories will get reward 0")
    if out == "-" or safety.output_target(out).how == safety.THROUGH:  # stdout, a device, a FIFO: no partial folder
        if resume:
            raise InputError("--resume needs --out to be a file", hint="write to a file, not stdout")
        result = mod.run(table, cfg, ctx)
        return _finish(mod, result, table, cfg, ctx, out, fmt)
    folder = partial_dir(out)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):  # rmtree / mkdir would fail late, raw
        raise InputError("is a symbolic link or not a folder; a rollout keeps its unfinished groups in a folder "
                         "of its own there", file=str(folder), hint="remove it (or move it away), or use another --out")
    done: list[pa.Table] = []
    if resume:
        done = read_done(out, cfg.model, cfg, table, mod.group_ids(table))
    elif folder.exists():
        if not _is_ours(folder):
            raise InputError("holds files a rollout does not write; refusing to delete it", file=str(folder),
                             hint="move them away, or use another --out")
        ctx.log(f"discarding unfinished groups in {folder} (use --resume to keep them)")
        shutil.rmtree(folder)
    done_groups = frozenset(g for t in done if t.num_rows for g in t.column("group_id").to_pylist())
    if done_groups:
        ctx.log(f"resume: {len(done_groups)} groups already done")
    numbers = [int(f.stem) for f in folder.glob("*.parquet") if f.stem.isdigit()] if folder.is_dir() else []
    sink = GroupSink(folder, start=max(numbers, default=0),
                     marker={"made_by": "atom rollout", "config": identity(cfg)})
    try:
        result = mod.run(table, cfg, ctx, done_groups=done_groups, sink=sink)
    except BaseException:
        _drop_if_empty(folder)
        raise
    tables = [t for t in done if t.num_rows] + [result]
    if len(tables) > 1:
        result = pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="permissive")
        result = _dedupe_sorted(result, mod.group_ids(table))
    written = _finish(mod, result, table, cfg, ctx, out, fmt)
    shutil.rmtree(folder, ignore_errors=True)
    return written


def _dedupe_sorted(result: pa.Table, order_ids: list[str]) -> pa.Table:
    """Question order, then sample order; one row per traj_id (the first seen wins)."""
    rank = {g: i for i, g in enumerate(order_ids)}
    seen, keep = set(), []
    gids = result.column("group_id").to_pylist()
    for i, tid in enumerate(result.column("traj_id").to_pylist()):
        if tid not in seen:
            seen.add(tid)
            keep.append(i)
    samples = result.column("sample_idx").to_pylist()
    keep.sort(key=lambda i: (rank.get(gids[i], len(rank)), gids[i], samples[i]))
    return result.take(keep)


def _finish(mod, result, table, cfg, ctx, out, fmt) -> pa.Table:
    prov = mod.provenance_fields(cfg, ctx)
    result = schema.with_provenance(result, "rollout", cfg, inherit=table, **prov)
    tableio.write_table(result, out, fmt)
    if out != "-":
        ctx.log(f"[green]wrote[/] {out} ({result.num_rows} trajectories)")
    return result
