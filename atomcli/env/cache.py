"""The tool cache: one SQLite file of search results and page texts, which is also the
recorded environment that `replay:CACHE` serves.

A row is (kind, source, key) -> JSON value: kind `search` or `page`, source the backend
that produced it (`ddg/us-en/moderate`, `web`, ...), key the normalized query or URL. Failed
tool results are recorded too (ok=0) so that a replay reproduces the error observations of
the recorded run, but a live lookup only serves successful, fresh rows, and a failure never
overwrites a fresh success.

Several processes may share one file (rollout shards on one machine): WAL mode lets readers
run beside the one writer, busy_timeout waits for the write lock instead of failing, and
every write is a single short autocommit statement. Each thread gets its own connection.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
import unicodedata
from urllib.parse import urlsplit, urlunsplit

import orjson

from atomcli.errors import InputError

DEFAULT_TTL = 7 * 24 * 3600.0  # DeepResearcher's 7 days
SCHEMA_VERSION = 1

# One transaction: another process opening the same new file sees no tables or all of them, never
# `entries` without `meta` (which its foreign-file check would refuse).
_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS entries (
    kind TEXT NOT NULL, source TEXT NOT NULL, key TEXT NOT NULL,
    value TEXT NOT NULL, ok INTEGER NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (kind, source, key));
CREATE INDEX IF NOT EXISTS entries_by_key ON entries (kind, key, created);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '1');
COMMIT;
"""


def normalize_query(query: str) -> str:
    """Cache key of a search query: NFKC, case-folded, whitespace collapsed."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", query)).strip().casefold()


def normalize_url(url: str) -> str:
    """Cache key of a URL: scheme and host lower-cased, default port and fragment dropped."""
    url = url.strip()
    try:
        p = urlsplit(url)
        port = p.port
    except ValueError:
        return url
    if not p.scheme or not p.netloc:
        return url.split("#", 1)[0]
    scheme = p.scheme.lower()
    host = (p.hostname or "").rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    if port and not ((scheme == "http" and port == 80) or (scheme == "https" and port == 443)):
        host += f":{port}"
    if p.username is not None:
        host = p.username + (":" + p.password if p.password is not None else "") + "@" + host
    return urlunsplit((scheme, host, p.path or "/", p.query, ""))


class Cache:
    """Thread-safe, process-safe SQLite cache. `must_exist`: refuse to create a new file (replay)."""

    def __init__(self, path: str, *, ttl: float = DEFAULT_TTL, must_exist: bool = False):
        self.path, self.ttl = str(path), float(ttl)
        if must_exist and not os.path.exists(self.path):
            raise InputError("cache file not found", file=self.path,
                             hint="replay serves a cache recorded by an earlier run with --cache")
        # a file that is something else (the search index, a table) is refused before anything
        # writes to it: opening it below would switch its journal mode and add our tables
        from atomcli.safety import CACHE_TABLES, check_sqlite_file
        check_sqlite_file(self.path, CACHE_TABLES, "an atomcli tool cache",
                          hint="give --cache a new file name or a cache written by an earlier --cache run")
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._conn()  # create the schema now, so a bad path fails here and not mid-rollout

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        try:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout=30000")
            # switching to WAL needs a moment of exclusive access; another process may hold it
            for attempt in range(50):
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_SCHEMA)
                    break
                except sqlite3.OperationalError as e:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if "locked" not in str(e) or attempt == 49:
                        raise
                    time.sleep(0.05)
            conn.execute("PRAGMA synchronous=NORMAL")
        except sqlite3.DatabaseError as e:
            raise InputError(f"cannot open cache ({e})", file=self.path,
                             hint="give a new file name or an atomcli cache file") from e
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn

    def get(self, kind: str, key: str, *, source: str | None = None, max_age: float | None = None,
            ok_only: bool = False) -> dict | None:
        """The newest row for (kind, key) [from `source`], younger than max_age, or None."""
        sql = "SELECT value FROM entries WHERE kind = ? AND key = ?"
        args: list = [kind, key]
        if source is not None:
            sql += " AND source = ?"
            args.append(source)
        if max_age is not None:
            sql += " AND created >= ?"
            args.append(time.time() - max_age)
        if ok_only:
            sql += " AND ok = 1"
        row = self._conn().execute(sql + " ORDER BY created DESC LIMIT 1", args).fetchone()
        return orjson.loads(row[0]) if row else None

    def get_fresh(self, kind: str, key: str, source: str) -> dict | None:
        """What a live run may serve: a successful row from `source` within the TTL."""
        return self.get(kind, key, source=source, max_age=self.ttl, ok_only=True)

    def put(self, kind: str, key: str, source: str, value: dict, *, ok: bool = True) -> None:
        """Record a result. A failure does not replace a success that is still fresh."""
        now = time.time()
        self._conn().execute(
            "INSERT INTO entries (kind, source, key, value, ok, created) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (kind, source, key) DO UPDATE SET value = excluded.value, ok = excluded.ok, "
            "created = excluded.created WHERE excluded.ok = 1 OR entries.ok = 0 OR entries.created < ?",
            (kind, source, key, orjson.dumps(value).decode(), int(bool(ok)), now, now - self.ttl))

    def count(self, kind: str | None = None) -> int:
        if kind is None:
            return self._conn().execute("SELECT count(*) FROM entries").fetchone()[0]
        return self._conn().execute("SELECT count(*) FROM entries WHERE kind = ?", (kind,)).fetchone()[0]

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()
