"""The local search engine: building a BM25 index from a corpus, and the `local:INDEX` backend.

Engine: SQLite FTS5 from the standard library, Porter-stemmed unicode61
tokens, BM25 with the title weighted above the body. The index is one SQLite file:

- `docs(rowid, id, title, contents, url)`: the documents, stored once; `url` is the
  corpus's own url when it has one, else the local url `local://doc/<url-quoted id>`;
- `fts`: an external-content FTS5 table over `docs(title, contents)` (no second copy);
- `impacts(term, rowids, scores)`: precomputed BM25 per term and row (optional);
- `meta(key, value)`: format tag, engine, document count, corpus file name, impacts recipe.

Queries: every word is quoted and the words are OR-ed (so FTS5 syntax in model output is
plain text), English function words are dropped unless nothing else is left, and at most 32
terms are kept. Ranking is then exact BM25 over the remaining terms. FTS5's own `bm25()`
scores every document that matches any term (2 ms at 100k documents), so by default the
index also stores each term's precomputed BM25 contributions (`search_impacts.py`): a query
is then a few blob reads and a numpy sum with the same scores (0.26 ms), and FTS5 ranks only
what those cannot (phrases, function-word-only queries, indexes built with --no-impacts).
FTS5 still makes the snippets (a window of about 48 words around the query's terms); the `snippets=query` option
puts the window's sentences with the most query words first. bench/bench_search.py measures both paths.

`build_index` streams the corpus (JSONL line by line, Parquet batch by batch) so 100k+
document dumps never sit in memory as Python objects, and writes to a temporary file that is
renamed into place only when the build succeeded. `LocalIndex` answers any query a model can
write (it never raises on query text) and reads back whole documents for the urls it made,
which is how `browse_webpage` reads local results without a web server.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Iterator

from atomcli import __version__, plugins, tableio
from atomcli.env import search_impacts
from atomcli.errors import InputError, unknown_choice

FORMAT = "atomcli-index-1"
ENGINES = ("fts5",)
LOCAL_PREFIX = "local://doc/"
SNIPPET_TOKENS = 48   # FTS5 allows at most 64; ~40-60 words is what a web snippet shows
# How a snippet's sentences are ordered (`--search-options snippets=...`): "text" as FTS5 cuts them from the page;
# "query" those holding the most query words first, as a web engine puts its matching sentences up front.
SNIPPETS = "snippets"                 # the option's name
PAGE_ORDER, QUERY_ORDER = "text", "query"
SNIPPET_ORDERS = (PAGE_ORDER, QUERY_ORDER)
MAX_QUERY_TERMS = 32  # a model can write a page of text as a query; bound the OR clause
TITLE_WEIGHT, BODY_WEIGHT = 4.0, 1.0
WEIGHTS = (TITLE_WEIGHT, BODY_WEIGHT)
BATCH = 5000

# Dropped from queries (unless nothing else is left) because an OR over terms that occur in
# nearly every document makes FTS5 score the whole corpus: slow, and no help to the ranking.
STOPWORDS = frozenset("""a about after all also an and any are as at be been before being between both but by can
could did do does during each for from had has have he her hers him his how i if in into is it its me more most my no
nor not of on once only or other our out over own same she should so some such than that the their them then there
these they this those through to too under until up very was we were what when where which while who whom whose why
will with would you your""".split())

_WORD = re.compile(r"\w+", re.UNICODE)


def local_url(doc_id: str) -> str:
    return LOCAL_PREFIX + urllib.parse.quote(str(doc_id), safe="")


def query_words(query: str) -> list[str]:
    """The words a query is ranked on: function words dropped (unless nothing else is left),
    duplicates (case-folded) dropped, at most MAX_QUERY_TERMS."""
    words = _WORD.findall(query if isinstance(query, str) else str(query or ""))
    words = [w for w in words if w.replace("_", "")]  # underscores alone tokenize to nothing
    keep = [w for w in words if w.lower() not in STOPWORDS] or words
    seen, out = set(), []
    for w in keep:
        if w.lower() not in seen:
            seen.add(w.lower())
            out.append(w)
    return out[:MAX_QUERY_TERMS]


def match_expression(words: list[str]) -> str:
    """Query words -> a safe FTS5 MATCH expression: every word quoted, OR-ed together.

    Quoting turns FTS5 syntax (AND, NEAR, *, ^, column filters, stray quotes) into plain
    words, so the engine never sees an operator the model did not mean."""
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)


# --- building ------------------------------------------------------------------------------------

def build_index(corpus_path: str, out: str, *, engine: str = "fts5", impacts: bool = True, context=None) -> dict:
    """Build the index file `out` from a JSONL/Parquet corpus; return build statistics."""
    if engine not in ENGINES:
        if engine == "tantivy":
            raise InputError("engine `tantivy` is not supported by this version of atomcli",
                             hint="use --engine fts5 (SQLite, built in)")
        raise unknown_choice("index engine", engine, ENGINES)
    if out == "-":
        raise InputError("an index cannot be written to stdout", hint="give --out a file name, e.g. index.sqlite")
    from atomcli import safety
    # never over the corpus, a folder, or a file that is not an index (a cache, a table)
    safety.check_output(out, safety.INDEX, inputs=[corpus_path])
    name = "<stdin>" if corpus_path == "-" else corpus_path
    log = context.log if context is not None else (lambda m: None)
    t0 = time.perf_counter()
    dest = safety.output_target(out, stream=False).path  # a symlink's target is replaced, never the link
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.chmod(tmp, tableio.default_mode(0o666))  # mkstemp makes 0600; an index is as shareable as any output
    try:
        n = _build(_iter_docs(corpus_path, name), tmp, name, log, impacts)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    seconds = time.perf_counter() - t0
    log(f"[green]indexed[/] {n:,} documents into {out} in {seconds:.1f} s")
    return {"documents": n, "seconds": seconds, "engine": engine}


def _build(docs: Iterator[tuple[int, dict]], path: str, name: str, log, impacts: bool) -> int:
    con = sqlite3.connect(path)
    try:
        # A fresh file renamed into place only on success: no journal needed for safety.
        con.executescript("""
            PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=MEMORY;
            CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE docs(rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, title TEXT NOT NULL,
                              contents TEXT NOT NULL, url TEXT NOT NULL);
        """)
        n, batch, lines = 0, [], []
        for line, doc in docs:
            n += 1
            batch.append((n, doc["id"], doc["title"], doc["contents"], doc["url"]))
            lines.append(line)
            if len(batch) >= BATCH:
                _insert(con, batch, lines, name)
                batch, lines = [], []
                if n % 50000 == 0:
                    log(f"  {n:,} documents read")
        _insert(con, batch, lines, name)
        if n == 0:
            raise InputError("corpus has no documents", file=name,
                             hint="expected JSONL/Parquet rows with id, title, contents (or text)")
        con.executescript("""
            CREATE INDEX docs_url ON docs(url);
            CREATE VIRTUAL TABLE fts USING fts5(title, contents, content='docs', content_rowid='rowid',
                                                tokenize='porter unicode61 remove_diacritics 2');
            INSERT INTO fts(fts) VALUES('rebuild');
            INSERT INTO fts(fts) VALUES('optimize');
        """)
        meta = [("format", FORMAT), ("engine", "fts5"), ("documents", str(n)),
                ("corpus", Path(name).name), ("atomcli", __version__)]
        if impacts:
            terms = search_impacts.build(con, ("title", "contents"), WEIGHTS, STOPWORDS)
            meta.append((search_impacts.META_KEY, search_impacts.meta_value(WEIGHTS)))
            log(f"  {terms:,} terms with precomputed BM25 impacts")
        # Only the file's base name: the index bytes must not depend on where it was built.
        con.executemany("INSERT INTO meta VALUES (?, ?)", meta)
        con.commit()
        return n
    finally:
        con.close()


def _insert(con: sqlite3.Connection, batch: list, lines: list, name: str) -> None:
    if not batch:
        return
    try:
        con.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)", batch)
    except sqlite3.IntegrityError:
        # The failing row is the first whose id is already taken by an earlier row.
        for row, line in zip(batch, lines):
            if con.execute("SELECT 1 FROM docs WHERE id = ? AND rowid < ?", (row[1], row[0])).fetchone():
                raise InputError(f"line {line}: duplicate document id `{row[1]}`", file=name, row=line - 1,
                                 column="id", hint="document ids must be unique") from None
        raise


def _iter_docs(path: str, name: str) -> Iterator[tuple[int, dict]]:
    """(line number, normalized document) for every corpus row; InputError names the line."""
    if path == "-":
        stream = io.BytesIO(sys.stdin.buffer.read())
    else:
        p = Path(path)
        if not p.exists():
            raise InputError("corpus file not found", file=name, hint="check the path")
        if p.is_dir():
            raise InputError("is a folder, expected a JSONL or Parquet corpus", file=name)
        stream = open(p, "rb")
    with stream:
        head = stream.read(4)
        stream.seek(0)
        rows = _parquet_rows(stream, name) if head == b"PAR1" else _jsonl_rows(stream, name)
        for line, row in rows:
            yield line, _document(row, line, name)


def _jsonl_rows(stream, name: str) -> Iterator[tuple[int, dict]]:
    return tableio.jsonl_objects(stream, name, what="corpus")


def _parquet_rows(stream, name: str) -> Iterator[tuple[int, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(stream)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"not a readable Parquet file ({str(e).splitlines()[0]})", file=name) from None
    cols = set(pf.schema_arrow.names)
    for need, alts in (("id", ("id",)), ("contents", ("contents", "text"))):
        if not cols & set(alts):
            raise InputError(f"corpus has no `{need}` column", file=name, column=need,
                             hint="expected columns id, title, contents (or text), optional url")
    wanted = [c for c in ("id", "title", "contents", "text", "url") if c in cols]
    line = 0
    batches = pf.iter_batches(batch_size=BATCH, columns=wanted)
    while True:
        try:  # a damaged data page surfaces only when its batch is decoded
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"corrupt Parquet data after line {line} ({str(e).splitlines()[0]})", file=name,
                             row=line, hint="the file may be truncated or corrupted; rewrite it") from None
        if batch is None:
            break
        for row in batch.to_pylist():
            line += 1
            yield line, row


def _document(row: dict, line: int, name: str) -> dict:
    """Check one corpus row and normalize it to {id, title, contents, url} strings."""
    doc_id = row.get("id")
    if doc_id is None or (isinstance(doc_id, str) and not doc_id.strip()):
        raise InputError(f"line {line} has no `id`", file=name, row=line - 1, column="id",
                         hint="every document needs an id (and contents or text)")
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
        raise InputError(f"line {line}: `id` must be a string or an integer", file=name, row=line - 1, column="id")
    contents = row.get("contents")
    if contents is None:
        contents = row.get("text")
    if not isinstance(contents, str):
        what = "has no `contents` (or `text`)" if contents is None else "has a non-text `contents`"
        raise InputError(f"line {line} {what}", file=name, row=line - 1, column="contents",
                         hint="expected columns id, title, contents (or text), optional url")
    title = row.get("title")
    if title is None:
        title, contents = _split_flashrag(contents)
    url = row.get("url")
    doc_id = str(doc_id)
    return {"id": doc_id, "title": str(title), "contents": contents,
            "url": url if isinstance(url, str) and url.strip() else local_url(doc_id)}


def _split_flashrag(contents: str) -> tuple[str, str]:
    """FlashRAG / Search-R1 wiki dumps have no title column: the first line is `"Title"`."""
    first, nl, rest = contents.partition("\n")
    if nl and len(first) >= 2 and first.startswith('"') and first.endswith('"'):
        return first[1:-1], rest
    return "", contents


# --- searching -------------------------------------------------------------------------------------

class LocalIndex:
    """A read-only BM25 index. Thread-safe: each thread gets its own SQLite connection."""

    def __init__(self, path: str, snippets: str = PAGE_ORDER):
        check_snippet_order(snippets)
        self.path = path
        self.snippets = snippets
        # the name keys tool caches: a non-default snippet order is another engine's output
        self.name = f"local:{path}" + ("" if snippets == PAGE_ORDER else f"?{SNIPPETS}={snippets}")
        self.traits = plugins.SearchTraits(self.name, local_documents=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        con = self._con()
        try:
            meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as e:
            self.close()
            raise InputError(f"not an atomcli search index ({e})", file=path,
                             hint="build one with `atom index CORPUS --out INDEX`") from None
        if meta.get("format") != FORMAT:
            self.close()
            raise InputError(f"unsupported index format `{meta.get('format')}`", file=path,
                             hint="rebuild it with `atom index CORPUS --out INDEX`")
        self.documents = int(meta.get("documents", 0))
        # Indexes built before impacts existed (or with other weights) rank through FTS5 alone.
        self.impacts = meta.get(search_impacts.META_KEY) == search_impacts.meta_value(WEIGHTS)

    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            # immutable=1: no locks and no journal lookups; the index never changes once built
            uri = "file:" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro&immutable=1"
            con = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._local.con = con
            self._local.ranker = search_impacts.Ranker(con)
            with self._lock:
                self._all.append(con)
        return con

    def search(self, query: str, k: int = 10) -> list[dict]:
        """Top-k documents by BM25: [{title, url, snippet, score, id}] (score: FTS5's bm25 negated, higher is
        better; id: the corpus document id). Never raises on the query text."""
        words = query_words(query)
        if not words or k <= 0:
            return []
        expr = match_expression(words)
        con = self._con()
        top = self.rank_impacts(words, int(k))
        if top is None:
            top = self.rank_fts5(expr, int(k))
        # Title, url, snippet, score and id for the k winners only.
        out = []
        for rowid in top:
            title, url, snip, score, doc_id = con.execute(
                f"SELECT d.title, d.url, snippet(fts, 1, '', '', '…', {SNIPPET_TOKENS}), "
                f"bm25(fts, {TITLE_WEIGHT}, {BODY_WEIGHT}), d.id FROM fts "
                "JOIN docs d ON d.rowid = fts.rowid WHERE fts MATCH ? AND fts.rowid = ?", (expr, rowid)).fetchone()
            snip = " ".join(snip.split())
            if self.snippets == QUERY_ORDER:
                snip = order_snippet(snip, words)
            out.append({"title": title, "url": url, "snippet": snip, "score": -score, "id": doc_id})
        return out

    def rank_impacts(self, words: list[str], k: int) -> list[int] | None:
        """Top-k row ids from the precomputed impacts; None when FTS5 must rank this query."""
        if not self.impacts:
            return None
        self._con()
        return self._local.ranker.top(words, k)

    def rank_fts5(self, expr: str, k: int) -> list[int]:
        """Top-k row ids by FTS5's own bm25(): the reference the impacts reproduce, and the fallback."""
        # bm25() with explicit weights is ~30% faster than ORDER BY rank with a rank config.
        return [r for (r,) in self._con().execute(
            f"SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY bm25(fts, {TITLE_WEIGHT}, {BODY_WEIGHT}) "
            "LIMIT ?", (expr, k))]

    def read_local(self, url: str) -> str | None:
        """The whole document (title, blank line, contents) behind a url this index returned."""
        if not isinstance(url, str):
            return None
        row = self._con().execute("SELECT title, contents FROM docs WHERE url = ? LIMIT 1", (url,)).fetchone()
        if row is None and url.startswith(LOCAL_PREFIX):  # tolerate an unquoted id
            doc_id = urllib.parse.unquote(url[len(LOCAL_PREFIX):])
            row = self._con().execute("SELECT title, contents FROM docs WHERE id = ?", (doc_id,)).fetchone()
        if row is None:
            return None
        title, contents = row
        return f"{title}\n\n{contents}" if title else contents

    def close(self) -> None:
        with self._lock:
            for con in self._all:
                with contextlib.suppress(sqlite3.Error):
                    con.close()
            self._all.clear()
        self._local = threading.local()


def check_snippet_order(order: str) -> None:
    if order not in SNIPPET_ORDERS:
        raise unknown_choice("snippets order", order, SNIPPET_ORDERS)


def snippet_options(order: str) -> dict:
    """The search options that select a snippet order ({} for the default, so caches keep their keys)."""
    return {} if order == PAGE_ORDER else {SNIPPETS: order}


def _stem(word: str) -> str:
    """A crude case-folded stem, enough to match "defaults" with "default" (FTS5's Porter stemmer is not exposed)."""
    w = word.lower()
    for suffix in ("ing", "ed", "es", "s"):
        if len(w) > len(suffix) + 2 and w.endswith(suffix):
            return w[:-len(suffix)]
    return w


def split_snippet(snippet: str) -> tuple[str, list[str], str]:
    """(the leading "…" or "", the sentences between, the trailing "…" or ""): a snippet as FTS5 cut it."""
    from atomcli.env.reader import split_sentences
    head = "…" if snippet.startswith("…") else ""
    tail = "…" if snippet.endswith("…") and len(snippet) > 1 else ""
    return head, split_sentences(snippet[len(head):len(snippet) - len(tail)]), tail


def order_snippet(snippet: str, words: list[str]) -> str:
    """The snippet's sentences reordered: those holding the most distinct query words first, ties in page order.
    The text is unchanged otherwise; a fragment cut by FTS5 keeps its "…" on the side where it was cut."""
    head, parts, tail = split_snippet(snippet)
    if len(parts) < 2:
        return snippet
    parts[0], parts[-1] = head + parts[0], parts[-1] + tail
    wanted = {_stem(w) for w in words}
    hits = [len(wanted & {_stem(w) for w in _WORD.findall(p)}) for p in parts]
    order = sorted(range(len(parts)), key=lambda i: (-hits[i], i))
    return " ".join(parts[i] for i in order)


@plugins.register_search("local")
def open_index(arg: str, context=None, snippets: str = PAGE_ORDER, **options) -> LocalIndex:
    """`local:INDEX`: open an index built by `atom index`. Options: snippets=text|query (SNIPPET_ORDERS)."""
    if not arg:
        raise InputError("search spec `local:` needs an index path", hint="local:PATH_TO_INDEX")
    p = Path(arg).expanduser()
    if not p.exists():
        raise InputError("search index not found", file=arg, hint="build it with `atom index CORPUS --out INDEX`")
    if p.is_dir():
        raise InputError("is a folder, expected an index file", file=arg,
                         hint="for the demo world use DIR/index.sqlite")
    return LocalIndex(str(p), snippets=snippets)
