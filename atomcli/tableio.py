"""Reading and writing trajectory tables, and atomic outputs.

Inputs: Parquet or JSONL, from a path or `-` (stdin, buffered in memory because Parquet
needs to seek). The format is sniffed from the magic bytes, so extensions do not matter.
Outputs: Parquet (default) or JSONL (`fmt="jsonl"` or a `.jsonl` name), to a path or `-`.
Every output is written to a temporary file in the target folder and renamed into place,
so a crash or a bad row never leaves a half-written file under the final name. What the
output path is decides how (atomcli.safety.output_target): a character device (/dev/null), a
FIFO or a link to a stream (/dev/stdout) is written through once the output is whole, never
replaced by a regular file; a symlink's target is replaced and the link kept.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from atomcli import safety, schema
from atomcli.errors import InputError

PARQUET_MAGIC = b"PAR1"
# Rows per Parquet row group. pyarrow's default (1M) makes a 10k-row table one 100 MB group that
# is decoded all at once; groups of ~1k trajectories (10-100 MB) read with ~30% less peak memory
# and in parallel (bench/bench_tableio.py).
ROW_GROUP = 1024


def read_bytes(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", file=path, hint="check the path")
    if p.is_dir():
        raise InputError("is a folder, expected a Parquet or JSONL file", file=path)
    return p.read_bytes()


def read_table(path: str, data: bytes | None = None) -> pa.Table:
    """Read a Parquet or JSONL table; known columns are cast to their contract types."""
    name = "<stdin>" if path == "-" else path
    if data is None and path != "-" and _is_parquet_file(path):
        # Straight from the file: no copy of its bytes in memory (a 100k-row table is ~1 GB).
        return schema.conform(_read_parquet(path, name), name)
    raw = read_bytes(path) if data is None else data
    if not raw.strip():
        raise InputError("input is empty", file=name, hint="expected Parquet or JSONL rows")
    if raw[:4] == PARQUET_MAGIC:
        table = _read_parquet(pa.BufferReader(raw), name)
    else:
        table = _read_jsonl(raw, name)
    return schema.conform(table, name)


def _is_parquet_file(path: str) -> bool:
    p = Path(path)
    if not p.is_file():
        return False  # read_bytes says what is wrong
    with open(p, "rb") as f:
        return f.read(4) == PARQUET_MAGIC


def _read_parquet(source, name: str) -> pa.Table:
    try:
        # pre_buffer (pyarrow's default) holds whole compressed row groups in memory while decoding:
        # +1 GB of peak for a 100k-row table, for no gain reading a local file
        return pq.read_table(source, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file ({str(e).splitlines()[0]})", file=name,
                         hint="the file may be truncated or corrupted; rewrite it") from None


UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def jsonl_objects(lines: Iterable[bytes], name: str, what: str = "file") -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank JSONL line; bad lines raise a located InputError.

    The row an error names is the table row the line would have been (blank lines make no row);
    the line number counts every line. A UTF-8 byte-order mark (Windows editors write one) is
    skipped; a UTF-16 one is named. Shared by table reading (a whole buffer) and `atom index`
    (a streamed corpus)."""
    row = 0
    for lineno, line in enumerate(lines, start=1):
        if lineno == 1:
            if line.startswith(UTF16_BOMS):
                raise InputError("the file is UTF-16 (it starts with a UTF-16 byte-order mark)", file=name, row=0,
                                 hint=f"re-encode the {what} as UTF-8")
            if line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM):]
        if not line.strip():
            continue
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"line {lineno} is not valid UTF-8 (byte {e.start})", file=name,
                             row=row, hint=f"re-encode the {what} as UTF-8") from None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            hint = "is this a Parquet file that lost its header?" if row == 0 and _binary(line) \
                else "each line must be one JSON object"
            raise InputError(f"line {lineno} is not valid JSON ({e.msg})", file=name,
                             row=row, hint=hint) from None
        if not isinstance(obj, dict):
            raise InputError(f"line {lineno} is not a JSON object", file=name, row=row,
                             hint="each line must be one JSON object")
        yield lineno, obj
        row += 1


def _binary(line: bytes) -> bool:
    """Bytes no text file starts with: NUL or other C0 controls but tab, newline and carriage return."""
    return any(b < 0x20 and b not in (9, 10, 13) for b in line[:64])


def _read_jsonl(raw: bytes, name: str) -> pa.Table:
    rows = [obj for _, obj in jsonl_objects(raw.split(b"\n"), name)]
    if not rows:
        raise InputError("input has no rows", file=name, hint="expected JSONL rows")
    columns: dict[str, None] = {}
    for r in rows:
        for k in r:
            columns.setdefault(k, None)
    arrays = {}
    for col in columns:
        values = [r.get(col) for r in rows]
        try:
            arrays[col] = schema.array(col, values)
        except ValueError as e:
            row = _first_bad_row(col, values)
            raise InputError(f"column `{col}` has a value of the wrong type ({e})".replace("\n", " ")[:300],
                             file=name, row=row, column=col,
                             hint=f"expected {schema.COLUMNS[col].type}" if col in schema.COLUMNS else None) from None
    return pa.table(arrays)


def _first_bad_row(col: str, values: list) -> int | None:
    for i, v in enumerate(values):
        try:
            schema.array(col, [v])
        except ValueError:
            return i
    return None


# --- writing ---------------------------------------------------------------------------------

def out_format(path: str, fmt: str | None) -> str:
    if fmt:
        if fmt not in ("parquet", "jsonl"):
            raise InputError(f"unknown format `{fmt}`", hint="valid: jsonl, parquet")
        return fmt
    return "jsonl" if path.endswith((".jsonl", ".json", ".ndjson")) else "parquet"


def table_bytes(table: pa.Table, fmt: str) -> bytes:
    if fmt == "jsonl":
        opts = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
        return b"".join(orjson.dumps(r, option=opts) for r in table.to_pylist())
    buf = io.BytesIO()
    _write_parquet(table, buf)
    return buf.getvalue()


def _write_parquet(table: pa.Table, sink) -> None:
    pq.write_table(table, sink, compression="zstd", row_group_size=ROW_GROUP)


def write_table(table: pa.Table, path: str, fmt: str | None = None) -> None:
    """Write atomically: the destination changes only once the whole table is serialized.

    To a file, Parquet streams into a temporary file beside it (no copy of the output in
    memory) that is renamed into place; to stdout, the bytes are made first, then written."""
    fmt = out_format(path, fmt)
    if path == "-":
        data = table_bytes(table, fmt)
        if fmt == "jsonl":  # a terminal may be reading: C1 controls and bidi marks as \u escapes, the same JSON
            data = safety.visible_json(data.decode("utf-8")).encode("utf-8")
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    elif fmt == "parquet":
        with _atomic_file(Path(path)) as f:
            _write_parquet(table, f)
    else:
        write_bytes_atomic(Path(path), table_bytes(table, fmt))


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask is process-wide and not thread-safe


def default_mode(mode: int) -> int:
    """`mode` filtered by the process umask (what open() would have given a new file)."""
    return mode & ~_UMASK


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with _atomic_file(Path(path)) as f:
        f.write(data)


@contextlib.contextmanager
def _atomic_file(path: Path):
    """A binary file object for a temporary file beside `path`, renamed onto it on success.

    What `path` is decides (safety.output_target): a device, a FIFO or a stdout link is written
    through once the whole output is made, never renamed over; a symlink's target is replaced,
    the link kept; a folder, a block device or a socket is refused (exit 2)."""
    target = safety.output_target(path)
    if target.how == safety.THROUGH:
        buf = io.BytesIO()
        yield buf
        _write_through(target.path, buf.getvalue())
        return
    path = target.path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, default_mode(0o666))  # mkstemp makes 0600; outputs get the usual mode
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_through(path: Path, data: bytes) -> None:
    """Write `data` into a device, a FIFO (waits for its reader) or a stream link, appending as a
    shell's `>>` would: the file a `> log` redirection opened keeps what the process wrote before."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        raise InputError(f"cannot be opened for writing ({e.strerror})", file=str(path),
                         hint="give another path") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def share_folder(root: Path) -> None:
    """Give everything under `root` the mode a new file or folder gets from the umask.

    Libraries write some files through temporary files of their own (transformers' weight shards),
    which mkstemp makes 0600; a server running as another user (policy sync) must read them."""
    for folder, dirs, files in os.walk(root):
        os.chmod(folder, default_mode(0o777))
        for name in files:
            f = os.path.join(folder, name)
            st = os.lstat(f)
            if stat.S_ISREG(st.st_mode):
                want = default_mode(0o777 if st.st_mode & 0o100 else 0o666)
                if st.st_mode & 0o777 != want:
                    os.chmod(f, want)


@contextlib.contextmanager
def atomic_dir(path: str | Path):
    """Yield a temporary folder next to `path`; on success it replaces `path` in one rename.

    On any exception the temporary folder is removed and an existing `path` is left intact.
    A symlink to a folder keeps pointing at the new folder (its target is replaced, not the link);
    anything else that is not a folder is refused before the work (safety.output_target). Files
    in the folder get the umask's mode, whoever wrote them (share_folder)."""
    path = safety.output_target(path, folder=True).path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, default_mode(0o777))  # mkdtemp makes 0700
    try:
        yield tmp
        share_folder(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_stage(result: pa.Table, path: str, stage: str, config, *, inherit: pa.Table | None = None,
                fmt: str | None = None, **prov) -> None:
    """Append the stage's provenance record and write atomically.

    The single commands and `run-all` both write through here, so their tables match."""
    table = schema.with_provenance(result, stage, config, inherit=inherit, **prov)
    write_table(table, path, fmt)
