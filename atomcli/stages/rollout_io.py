"""Files around a rollout: completed groups persisted as they finish, `--resume`, atomic finish.

While `atom rollout ... --out OUT` runs, every completed group is written at once as a
small Parquet file in `.OUT.partial/` next to OUT (each file itself written atomically).
On success the partial rows, any rows kept from an earlier OUT and the new rows are
concatenated in question order, stamped with provenance, written to OUT atomically, and
the partial folder is removed. A crash or Ctrl-C leaves OUT untouched (or absent) and the
completed groups in the partial folder; `--resume` skips the groups found there and in an
existing OUT. Without `--resume` a leftover partial folder is discarded. Shards
(`--shard i/n`) are independent runs with their own OUT; their outputs concatenate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa

from atomcli import schema, tableio
from atomcli.errors import InputError


def partial_dir(out: str) -> Path:
    p = Path(out)
    return p.parent / f".{p.name}.partial"


class GroupSink:
    """Writes each completed group as `NNNNNN.parquet` in the partial folder."""

    def __init__(self, folder: Path, start: int = 0):
        self.folder, self.count = folder, start
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, group: pa.Table) -> None:
        self.count += 1
        tableio.write_bytes_atomic(self.folder / f"{self.count:06d}.parquet", tableio.table_bytes(group, "parquet"))


def read_done(out: str, policy: str) -> list[pa.Table]:
    """Rows already made: an existing OUT, then the partial folder's groups."""
    tables = []
    if Path(out).exists():
        tables.append(tableio.read_table(out))
    folder = partial_dir(out)
    if folder.is_dir():
        tables += [tableio.read_table(str(f)) for f in sorted(folder.glob("*.parquet"))]
    for t in tables:
        if t.num_rows == 0:
            continue
        if "group_id" not in t.column_names or "policy" not in t.column_names:
            raise InputError("cannot resume: not a rollout table", file=out, hint="drop --resume to start over")
        policies = set(t.column("policy").to_pylist())
        if policies - {policy}:
            raise InputError(f"cannot resume: rows were made by policy {sorted(policies - {policy})[0]!r}, "
                             f"not {policy!r}", file=out, hint="drop --resume to start over, or use another --out")
    return tables


def run_to_file(mod, table: pa.Table, cfg, ctx, *, out: str, fmt: str | None, resume: bool) -> pa.Table:
    """Run the rollout stage `mod` on `table` and write OUT (see the module docstring)."""
    tableio.out_format(out, fmt)  # a bad --format fails before any work
    mod.validate(cfg)
    if out == "-":
        if resume:
            raise InputError("--resume needs --out to be a file", hint="write to a file, not stdout")
        result = mod.run(table, cfg, ctx)
        return _finish(mod, result, table, cfg, ctx, out, fmt)
    folder = partial_dir(out)
    done: list[pa.Table] = []
    if resume:
        done = read_done(out, cfg.model)
    elif folder.exists():
        ctx.log(f"discarding unfinished groups in {folder} (use --resume to keep them)")
        shutil.rmtree(folder)
    done_groups = frozenset(g for t in done if t.num_rows for g in t.column("group_id").to_pylist())
    if done_groups:
        ctx.log(f"resume: {len(done_groups)} groups already done")
    numbers = [int(f.stem) for f in folder.glob("*.parquet") if f.stem.isdigit()] if folder.is_dir() else []
    sink = GroupSink(folder, start=max(numbers, default=0))
    result = mod.run(table, cfg, ctx, done_groups=done_groups, sink=sink)
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
