"""Guards every command shares, one per class of failure (docs/RELIABILITY.md, rounds two and three).

- **Outputs** (`check_outputs`, `check_output`, `Kind`): a command never writes an output over
  one of its own inputs (the same file by inode, or an input inside a folder it is about to
  replace), never replaces a non-empty folder it did not make (each folder kind is recognised
  by the marker files its writer leaves: `CHECKPOINT`, `DEMO_WORLD`, `RUN`), never replaces a
  file that is not what it writes (`INDEX`), and a file output that names an existing folder
  fails before the stage runs. Called by every command before it reads or computes anything.
- **What an output path is** (`output_target`, `check_writable`): a device, a FIFO or a link to a
  stream is written through, a symlink's target is replaced (never the link), a block device, a
  socket or a folder where a file belongs is refused; an output whose folder cannot be written is
  refused before the work. The guard above and tableio's atomic writers share the one decision.
- **Files that are not ours** (`sqlite_tables`): what a SQLite file holds, read without
  writing to it, so that an index or a cache is recognised before anything opens it for writing.
- **Resume identity** (`config_diff`, `describe_diff`): what differs between the run found on
  disk and the run asked for, for the message of a refused `--resume`.
- **Secrets in settings** (`check_no_secret`, `check_no_secrets`, `redact_secrets`): a credential
  written into a SPEC or any setting (URL user info, a key-like query parameter, a bearer token, an
  Authorization header, a `--api-key` option, an API-key-like token in a policy-sync command) is
  refused where settings enter (config building, plugin SPECs, the OpenAI engine, policy sync), so
  it can never reach a table, provenance, config.json, a checkpoint or a log; `redact_secrets`
  masks one in any message that leaves the process anyway.
- **Terminal text** (`visible`, `visible_tree`, `visible_json`, `console`): text from a table, a
  model, a page or a corpus is printed with its control characters (escape sequences, C1 controls,
  bidi overrides) shown as escapes, never interpreted by the terminal; `console` is the rich
  Console that applies `visible` to everything it prints (the context's, show's).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping
from urllib.parse import parse_qsl, quote, urlsplit

from atomcli.errors import InputError

# --- outputs --------------------------------------------------------------------------------------

CHECKPOINT_MARKERS = ("atom_state.json", "config.json")  # checkpoint.save / any transformers model folder
DEMO_WORLD_MARKER = "corpus.jsonl"
RUN_MARKER = "atom_run.json"  # written by `atom run-all` into every run folder it makes


@dataclass(frozen=True)
class Kind:
    """What an output is: a file or a folder, and how an existing one that may be replaced looks."""
    what: str
    folder: bool = False
    ours: Callable[[Path], bool] | None = None  # an existing, non-empty target: may it be replaced?
    hint: str = "give a new name, or move the existing one away yourself"
    stream: bool = True  # may it be written through a device, a FIFO or a stdout link (not: a SQLite file)


def _has_any(*names: str) -> Callable[[Path], bool]:
    return lambda p: any((p / n).exists() for n in names)


def sqlite_tables(path: str | Path) -> set[str] | None:
    """The table names of a SQLite file (never written to), or None when it is not SQLite."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return None
    except OSError:
        return None
    query = "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
    for uri in (f"file:{quote(str(p.resolve()))}?mode=ro", None):
        try:
            # read-only first; a WAL file whose -shm is missing needs a normal connection, which
            # still only reads here (query_only)
            con = sqlite3.connect(uri, uri=True) if uri else sqlite3.connect(str(p))
            try:
                if uri is None:
                    con.execute("PRAGMA query_only=ON")
                return {r[0] for r in con.execute(query)}
            finally:
                con.close()
        except sqlite3.Error:
            continue
    return None


INDEX_TABLES = {"docs", "meta", "fts"}   # atomcli.env.search_local
CACHE_TABLES = {"entries", "meta"}       # atomcli.env.cache


def is_index_file(p: Path) -> bool:
    return INDEX_TABLES <= (sqlite_tables(p) or set())


def is_run_folder(p: Path) -> bool:
    """A folder `atom run-all` made: its marker, or (runs made before the marker) its config.json."""
    if (p / RUN_MARKER).is_file():
        return True
    try:
        return "run-all" in json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


FILE = Kind("file")
CHECKPOINT = Kind("checkpoint folder", folder=True, ours=_has_any(*CHECKPOINT_MARKERS),
                  hint="give a new --out; a checkpoint folder (atom_state.json or config.json) may be replaced")
DEMO_WORLD = Kind("demo-world folder", folder=True, ours=_has_any(DEMO_WORLD_MARKER))
RUN = Kind("run folder made by `atom run-all`", folder=True, ours=is_run_folder,
           hint="give a new --out (run-all writes into a folder of its own)")
INDEX = Kind("search index made by `atom index`", ours=is_index_file, stream=False)


def _exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _inside(child: Path, parent: Path) -> bool:
    try:
        c, q = child.resolve(), parent.resolve()
    except OSError:
        return False
    return c != q and q in c.parents


def check_output(out: str | Path | None, kind: Kind = FILE, *, inputs: Iterable = (), flag: str = "--out") -> None:
    """Refuse `out` before any work when writing it could destroy something (see the module doc)."""
    check_outputs({flag: out}, kind, inputs=inputs)


def check_outputs(outputs: Mapping[str, str | Path | None], kind: Kind = FILE, *, inputs: Iterable = ()) -> None:
    """`check_output` for each {flag: path}; two outputs of one command may not be one file either."""
    inputs = [Path(str(i)) for i in inputs if i is not None and str(i) not in ("", "-")]
    inputs = [i for i in inputs if _exists(i)]
    seen: list[tuple[str, Path]] = []
    for flag, out in outputs.items():
        if out is None or str(out) == "":
            continue
        if str(out) == "-":
            if kind.folder:
                raise InputError(f"{flag} cannot be `-` (stdout): a {kind.what} is written to disk",
                                 hint="give a folder name")
            continue
        p = Path(str(out))
        _check_target(p, kind, flag)
        for src in inputs:
            if _same(p, src):
                raise InputError(f"{flag} is also an input of this command ({src}); writing there would destroy it",
                                 file=str(out), hint="write the output to a new file")
            if kind.folder and _inside(src, p):
                raise InputError(f"{flag} folder holds the input {src}; replacing the folder would delete it",
                                 file=str(out), hint="give a new folder for the output")
            if src.is_dir() and _exists(p) and _inside(p, src):
                raise InputError(f"{flag} would replace a file inside the input folder {src}", file=str(out),
                                 hint="write the output outside the input folder")
        for other_flag, other in seen:
            if _same(p, other) or p.resolve() == other.resolve():
                raise InputError(f"{flag} and {other_flag} name the same file; one would overwrite the other",
                                 file=str(out), hint="give each output its own name")
        seen.append((flag, p))
        # what the path is (device, FIFO, link, folder) and whether it can be written: before any work
        check_writable(output_target(p, folder=kind.folder, stream=kind.stream, flag=flag), flag)


def _check_target(p: Path, kind: Kind, flag: str) -> None:
    if not _exists(p):
        return
    name = str(p)
    if kind.folder:
        if not p.is_dir():
            raise InputError(f"exists and is not a folder; refusing to replace it with a {kind.what}", file=name,
                             hint=kind.hint)
        if any(p.iterdir()) and not (kind.ours and kind.ours(p)):
            raise InputError(f"exists, is not empty and is not a {kind.what}; refusing to replace it", file=name,
                             hint=kind.hint)
        return
    if p.is_dir():
        raise InputError(f"is a folder; {flag} needs a file name", file=name,
                         hint=f"e.g. {p / 'out'}{'' if p.suffix else '.parquet'}" if flag == "--out" else
                         "give a file name")
    if kind.ours and p.is_file() and p.stat().st_size and not kind.ours(p):
        raise InputError(f"exists and is not a {kind.what}; refusing to replace it", file=name, hint=kind.hint)


# --- what an output path is --------------------------------------------------------------------------

NEW, REPLACE, THROUGH = "new", "replace", "through"
_PROC_FD = re.compile(r"/proc/[^/]+/fd/\d+")


@dataclass(frozen=True)
class Target:
    """Where an output really goes. `how`: NEW (no file yet: made beside `path` and renamed onto it),
    REPLACE (a regular file or folder, replaced by one rename; a symlink's target, never the link
    itself) or THROUGH (a character device such as /dev/null, a FIFO, or a link to one of this
    process's streams such as /dev/stdout: opened and written, never renamed over)."""
    how: str
    path: Path


def _through_fd_link(p: Path) -> bool:
    """Does resolving `p` pass through /proc/PID/fd/N (/dev/stdout, /dev/fd/1, a link to either)?
    realpath cannot say: it resolves such a link to `pipe:[…]` or to the file the shell opened."""
    path = os.path.abspath(p)
    for _ in range(40):  # the kernel's own limit on links followed
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if _PROC_FD.fullmatch(path):
            return True
        if not os.path.islink(path):
            return False
        path = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return False


def output_target(out: str | Path, *, folder: bool = False, stream: bool = True, flag: str = "--out") -> Target:
    """What writing the output `out` means, decided per kind of path; InputError (exit 2) where it
    may not be written at all (a block device, a socket, a folder for a file, a file for a folder).

    Shared by the output guard (before any work) and the writers (tableio's atomic writes), so a
    path is never swapped for a regular file: /dev/null stays a device, a FIFO stays a FIFO, a link
    stays a link to the new content."""
    p, name = Path(str(out)), str(out)
    if not _exists(p):
        return Target(NEW, p)
    try:
        st = os.stat(p)  # follows links
    except FileNotFoundError:  # a dangling link: the file it names is made
        real = Path(os.path.realpath(p))
        if str(real).startswith("/proc/"):
            raise InputError("is a link to a stream that is closed", file=name, hint="give a file name") from None
        return Target(NEW, real)
    except OSError as e:
        raise InputError(f"cannot be used as an output ({e.strerror})", file=name, hint="give another path") from None
    mode = st.st_mode
    if folder:
        if not stat.S_ISDIR(mode):
            raise InputError("exists and is not a folder; refusing to replace it with a folder", file=name,
                             hint=f"give {flag} a folder name")
        return Target(REPLACE, Path(os.path.realpath(p)))
    if stat.S_ISDIR(mode):
        raise InputError(f"is a folder; {flag} needs a file name", file=name, hint="give a file name")
    if stat.S_ISREG(mode):
        if _through_fd_link(p):  # `--out /dev/stdout > log`: the shell's file, written where it stands
            return _through(p, stream, flag)
        return Target(REPLACE, Path(os.path.realpath(p)))
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return _through(p, stream, flag)
    what = "a block device (a disk)" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
        "not a regular file"
    raise InputError(f"is {what}; refusing to write an output there", file=name, hint="give a file name")


def _through(p: Path, stream: bool, flag: str) -> Target:
    if not stream:
        raise InputError(f"is a device, a FIFO or a stream; {flag} must be a regular file here (it is "
                         "reopened and updated in place)", file=str(p), hint="give a file name")
    return Target(THROUGH, p)


def check_writable(target: Target, flag: str = "--out") -> None:
    """Refuse, before any work, an output that cannot be written: its folder (or the nearest one
    that exists, where the missing ones would be made) is not a folder, or no entry can be made in
    it (tried for real: access(2) says yes to root on /proc and /sys)."""
    name = str(target.path)
    if target.how == THROUGH:
        if not os.access(target.path, os.W_OK):
            raise InputError(f"{flag} cannot be written (permission denied)", file=name, hint="give another path")
        return
    folder = target.path.parent
    while not _exists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{flag} cannot be made: {folder} is not a folder", file=name,
                         hint="give a path inside a folder")
    try:  # a real entry, made and removed: permissions, read-only mounts and /proc-like folders all answer
        os.rmdir(tempfile.mkdtemp(prefix=".atom-probe-", dir=folder))
    except OSError as e:
        raise InputError(f"{flag} cannot be written: the folder {folder} is not writable ({e.strerror})", file=name,
                         hint="give a path in a writable folder") from None


def check_sqlite_file(path: str | Path, tables: set[str], what: str, hint: str) -> None:
    """Refuse an existing, non-empty file that is not SQLite with `tables` (before anything writes to it)."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"is a folder, expected {what}", file=str(path), hint=hint)
    if not p.is_file() or p.stat().st_size == 0:
        return
    found = sqlite_tables(p)
    if found is None:
        raise InputError(f"exists and is not {what} (not a SQLite file); refusing to write to it", file=str(path),
                         hint=hint)
    if found and not tables <= found:  # no tables at all: a new file another process is setting up
        shown = ", ".join(sorted(found)[:6]) or "none"
        raise InputError(f"exists and is not {what} (its tables: {shown}); refusing to write to it",
                         file=str(path), hint=hint)


# --- resume identity --------------------------------------------------------------------------------

_UNSET = "(unset)"


def config_diff(old: Mapping, new: Mapping, *, ignore: Iterable[str] = (), prefix: str = "") -> list[str]:
    """`key: old -> new` for every setting that differs (nested tables flattened as `[section] key`)."""
    ignore = set(ignore)
    out = []
    for key in sorted(set(old) | set(new), key=str):
        if key in ignore:
            continue
        a, b = old.get(key, _UNSET), new.get(key, _UNSET)
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out += config_diff(a, b, ignore=ignore, prefix=f"{prefix}[{key}] ")
        elif a != b and not (a == _UNSET and b in (None, {}) or b == _UNSET and a in (None, {})):
            out.append(f"{prefix}{key}: {_show(a)} -> {_show(b)}")
    return out


def _show(v) -> str:
    return v if v == _UNSET else redact_secrets(json.dumps(v, ensure_ascii=False))[:80]


def describe_diff(diffs: list[str], limit: int = 6) -> str:
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more


# --- secrets in SPEC strings --------------------------------------------------------------------------

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
SECRET_PARAMS = {"key", "api_key", "apikey", "api-key", "x-api-key", "access_token", "token", "auth", "secret",
                 "client_secret", "password", "passwd", "pwd", "sig", "signature", "bearer"}


def _url_secret(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        return None
    if user or password:
        return "credentials in its user part (user:key@host)"
    for part in (parts.query, parts.fragment):
        for k, v in parse_qsl(part, keep_blank_values=False):
            if k.strip().lower() in SECRET_PARAMS and v:
                return f"a `{k}` parameter"
    return None


# Credentials outside URLs, as a command line or a header carries them (a `command:` policy sync, say).
# A value that starts with `$` names an environment variable: a reference, not a key.
_BARE_SECRETS = (
    ("a bearer token", re.compile(r"(?i)\bbearer\s+(?![$%])([A-Za-z0-9._~+/=-]{8,})")),
    ("an Authorization header", re.compile(r"(?i)\bauthorization\s*[:=]\s*(?![$%])(?!bearer\b)([^\s\"']{6,})")),
    ("an API key header", re.compile(r"(?i)\b(?:x-api-key|api-key)\s*:\s*(?![$%])([^\s\"']{6,})")),
    ("a key-like option", re.compile(r"(?i)(?:^|[\s\"'])--?(?:api[-_]?key|access[-_]?token|auth[-_]?token|token|"
                                     r"password|passwd|secret|client[-_]secret)(?:=|\s+)(?![$%-])([^\s\"']{6,})")),
    # KEY=VALUE (an environment assignment, a search option): a value with a letter, 8 or more characters
    ("a key in an assignment", re.compile(r"(?i)\b[A-Za-z0-9_]*(?:api_?key|token|secret|password)="
                                          r"(?![$%])(?=[^\s\"',]*[A-Za-z])([^\s\"',]{8,})")),
    ("a token that looks like an API key", re.compile(
        r"(?<![A-Za-z0-9])(sk-[A-Za-z0-9_-]{16,}|sk_(?:live|test)_[A-Za-z0-9]{16,}|hf_[A-Za-z0-9]{20,}|"
        r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|"
        r"AIza[0-9A-Za-z_-]{30,})")),
)


def find_secret(text: str) -> str | None:
    """Why `text` seems to carry a credential (inside a URL, or a token, header or key option), or None."""
    if not isinstance(text, str):
        return None
    if "://" in text:
        for m in _URL.finditer(text):
            why = _url_secret(m.group())
            if why:
                return why
    for why, pattern in _BARE_SECRETS:
        if pattern.search(text):
            return why
    return None


_PARAM = re.compile(r"(?i)([?&#;])(" + "|".join(map(re.escape, sorted(SECRET_PARAMS, key=len, reverse=True)))
                    + r")=([^&#;\s]*)")


def _redact_url(m: re.Match) -> str:
    scheme, _, rest = m.group().partition("://")
    cut = re.search(r"[/?#]", rest)
    authority, tail = (rest[:cut.start()], rest[cut.start():]) if cut else (rest, "")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}://{authority}" + _PARAM.sub(lambda t: f"{t.group(1)}{t.group(2)}=***", tail)


def _mask_group(m: re.Match) -> str:
    start, end = m.span(1)
    return m.group()[:start - m.start()] + "***" + m.group()[end - m.start():]


def redact_secrets(text: str) -> str:
    """`text` with URL user info, key-like query values, bearer tokens, key options and API-key-like
    tokens replaced by `***`."""
    if not isinstance(text, str):
        return text
    if "://" in text:
        text = _URL.sub(_redact_url, text)
    for _, pattern in _BARE_SECRETS:
        text = pattern.sub(_mask_group, text)
    return text


def check_no_secret(value, what: str) -> None:
    """Refuse a SPEC (or any setting) that carries a credential: it would be stored and printed.

    Every string setting passes here when its config is built (config.build), and every SPEC where
    it enters, so nothing that is stored (config.json, provenance, atom_state.json) holds a key."""
    why = find_secret(value) if isinstance(value, str) else None
    if why:
        raise InputError(f"{what} `{redact_secrets(value)}` carries {why}; a key written into a setting would "
                         "be stored in tables, provenance, config.json and logs, so it is refused",
                         hint="remove it and put the key in the environment (OPENAI_API_KEY, the variable a "
                              "judge's api_key_env names; a policy-sync command inherits the environment, so "
                              "let it read the key there)")


def check_no_secrets(settings, where: str = "setting") -> None:
    """`check_no_secret` for every string in nested settings (dicts, lists), named by its key path:
    the last guard before settings are stored (run-all's config.json)."""
    def walk(obj, path: str) -> None:
        if isinstance(obj, str):
            check_no_secret(obj, f"{where} `{path}`" if path else where)
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
    walk(settings, "")


# --- terminal text ------------------------------------------------------------------------------------

# C0 controls but tab and newline, DEL, C1 controls (8-bit CSI/OSC), bidi embeddings, overrides and
# isolates (text that displays in another order than it reads), line/paragraph separators
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# what json.dumps(ensure_ascii=False) leaves raw of the above (it escapes C0 itself)
_JSON_RAW = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: str) -> str:
    """`text` with every control character shown as an escape (`\\x1b`, `\\u202e`); tab and newline kept."""
    return _CONTROL.sub(_escape, text) if isinstance(text, str) else text


def visible_tree(obj):
    """`visible` applied to every string in nested dicts, lists and tuples."""
    if isinstance(obj, str):
        return visible(obj)
    if isinstance(obj, dict):
        return {k: visible_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(visible_tree(v) for v in obj)
    return obj


def visible_json(text: str) -> str:
    """JSON text (from json.dumps) with the controls it leaves raw written as \\u escapes: same data."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_CONSOLE_CLASS = None


def console(**kwargs):
    """A rich Console that shows control characters in everything it prints as escapes (`visible`):
    plain strings, Text and table cells alike, while its own colours still work. Every console that
    prints table, model or page text is one of these (the context's, show's, eval's tables)."""
    global _CONSOLE_CLASS
    if _CONSOLE_CLASS is None:
        from rich.console import Console
        from rich.segment import Segment

        class VisibleConsole(Console):
            def render_str(self, text, **kwargs):  # strings are measured as they will be shown
                return super().render_str(visible(text), **kwargs)

            def render(self, renderable, options=None):
                for seg in super().render(renderable, options):
                    # control segments are rich's own cursor moves; text segments carry the data
                    yield seg if seg.control else Segment(visible(seg.text), seg.style, seg.control)

        _CONSOLE_CLASS = VisibleConsole
    return _CONSOLE_CLASS(**kwargs)
