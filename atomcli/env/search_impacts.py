"""Precomputed BM25 impacts: the fast, exact ranking path of the local search engine.

FTS5's `bm25()` is an auxiliary function called once per matching row, so an OR query over
one common word costs ~0.8 µs for every document containing it (2 ms at 100k documents,
25 ms on a worst-case corpus; bench/bench_search.py). But FTS5's BM25 contribution of one
term to one row does not depend on the rest of the query:

    idf(t) · f·(k1+1) / (f + k1·(1 − b + b·D/avgdl))      k1 = 1.2, b = 0.75
    f = Σ over the term's instances in the row of the column weight (title 4, body 1)
    D = tokens in the row (all columns), avgdl = tokens / rows, idf = ln((N − n + .5)/(n + .5)), ≥ 1e-6

so `build` computes it once per (term, row) after FTS5 has indexed the corpus, reading
FTS5's own postings through `fts5vocab` (the same tokens, stems and counts), and stores one
row per term: the row ids and their contributions as little-endian arrays. A query is then a
few blob reads and a numpy scatter-add, evaluated in the same floating-point order as
FTS5's C code, so scores equal `bm25()`'s (tests compare them).

`Ranker.top` returns None whenever it cannot reproduce FTS5 exactly, and the caller falls
back to FTS5: a query word that tokenizes to several tokens (FTS5 treats it as a phrase), a
function word (its postings are not stored: they cover most of the corpus and queries drop
them), or an index built before impacts existed.
"""

from __future__ import annotations

import sqlite3

import numpy as np

K1, B = 1.2, 0.75
TOKENIZE = "porter unicode61 remove_diacritics 2"
META_KEY = "impacts"


def meta_value(weights: tuple[float, ...]) -> str:
    """What the stored impacts were computed with; a mismatch means: do not use them."""
    return f"bm25 k1={K1} b={B} weights={','.join(map(str, weights))}"


def build(con: sqlite3.Connection, columns: tuple[str, ...], weights: tuple[float, ...],
          skip_words) -> int:
    """Create and fill `impacts(term, rowids, scores)` from the FTS5 table `fts`; return terms stored."""
    n_rows, lengths = _row_lengths(con, len(columns))
    if len(lengths) > 2**31:
        raise ValueError("row ids beyond 2^31 cannot be stored as impacts; build with --no-impacts")
    avgdl = float(lengths.sum()) / n_rows
    weight = dict(zip(columns, weights))
    skip = {t for toks in _tokens(con, sorted(skip_words)) for t in toks}
    con.executescript("""
        CREATE TABLE impacts(term TEXT PRIMARY KEY, rowids BLOB, scores BLOB) WITHOUT ROWID;
        CREATE VIRTUAL TABLE temp.fts_row USING fts5vocab(main, fts, row);
        CREATE VIRTUAL TABLE temp.fts_inst USING fts5vocab(main, fts, instance);
    """)
    rows_of = dict(con.execute("SELECT term, doc FROM temp.fts_row"))  # term -> rows containing it
    out, term, ids, freq = [], None, [], []

    def flush():
        if term is None:
            return
        r = np.asarray(ids, dtype=np.int64)
        f = np.asarray(freq, dtype=np.float64)
        n_hit = rows_of[term]
        idf = np.log((n_rows - n_hit + 0.5) / (n_hit + 0.5))
        idf = idf if idf > 0.0 else 1e-6
        d = lengths[r]
        # the operation order of fts5_aux.c, so that results are bit-identical to bm25()
        s = idf * ((f * (K1 + 1.0)) / (f + K1 * (1 - B + B * d / avgdl)))
        out.append((term, r.astype("<i4").tobytes(), s.astype("<f8").tobytes()))

    out.extend((t, None, None) for t in sorted(skip) if t in rows_of)
    # Instances come ordered by term, then row, then column: one pass, no sort. Function words
    # (~half of all tokens) are filtered inside SQLite, before Python sees a row.
    marks = ",".join("?" * len(skip))
    for t, row, col in con.execute(f"SELECT term, doc, col FROM temp.fts_inst WHERE term NOT IN ({marks})",
                                   sorted(skip)):
        if t != term:
            flush()
            term, ids, freq = t, [], []
        if ids and ids[-1] == row:
            freq[-1] += weight[col]
        else:
            ids.append(row)
            freq.append(weight[col])
        if len(out) >= 2000:
            con.executemany("INSERT INTO impacts VALUES (?, ?, ?)", out)
            out.clear()
    flush()
    con.executemany("INSERT INTO impacts VALUES (?, ?, ?)", out)
    con.executescript("DROP TABLE temp.fts_row; DROP TABLE temp.fts_inst;")
    return len(rows_of) - len(skip)


def _row_lengths(con: sqlite3.Connection, n_cols: int) -> tuple[int, np.ndarray]:
    """(rows, tokens per rowid): FTS5's `%_docsize` holds one varint per column per row."""
    rows = con.execute("SELECT id, sz FROM fts_docsize").fetchall()
    lengths = np.zeros(max(r for r, _ in rows) + 1, dtype=np.float64)
    for rowid, blob in rows:
        total, i, shift, v, cols = 0, 0, 0, 0, 0
        while i < len(blob) and cols < n_cols:
            byte = blob[i]
            v |= (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                total, v, shift, cols = total + v, 0, 0, cols + 1
        lengths[rowid] = total
    return len(rows), lengths


def _tokens(con: sqlite3.Connection, words: list[str]) -> list[list[str]]:
    """FTS5's tokens for each word (stemmed, folded), through a scratch FTS5 table in `temp`."""
    if not words:
        return []
    con.executescript(f"""
        CREATE VIRTUAL TABLE IF NOT EXISTS temp.qtok USING fts5(x, tokenize='{TOKENIZE}');
        CREATE VIRTUAL TABLE IF NOT EXISTS temp.qtok_inst USING fts5vocab(temp, qtok, instance);
    """)
    try:
        con.executemany("INSERT INTO temp.qtok(rowid, x) VALUES (?, ?)", enumerate(words))
        found = con.execute("SELECT doc, term FROM temp.qtok_inst ORDER BY doc, offset").fetchall()
    finally:
        con.execute("DELETE FROM temp.qtok")
    out: list[list[str]] = [[] for _ in words]
    for doc, term in found:
        out[doc].append(term)
    return out


class Ranker:
    """Top-k by BM25 from the stored impacts, for one SQLite connection (not shared across threads)."""

    def __init__(self, con: sqlite3.Connection):
        self.con = con

    def top(self, words: list[str], k: int) -> list[int] | None:
        """Row ids of the k best documents, best first; None when FTS5 must rank this query."""
        tokens = _tokens(self.con, words)
        if any(len(t) != 1 for t in tokens):
            return None  # a phrase (or nothing) to FTS5: only it knows about adjacency
        terms = [t[0] for t in tokens]
        found = {t: (r, s) for t, r, s in self.con.execute(
            f"SELECT term, rowids, scores FROM impacts WHERE term IN ({','.join('?' * len(terms))})", terms)}
        parts = []
        for t in terms:  # query order, duplicates included: each word is a phrase of its own in FTS5
            if t not in found:
                continue  # not in the corpus: contributes to no row
            rowids, scores = found[t]
            if rowids is None:
                return None  # a function word: postings not stored
            parts.append((np.frombuffer(rowids, "<i4"), np.frombuffer(scores, "<f8")))
        if not parts:
            return []
        ids = np.concatenate([p[0] for p in parts])
        sc = np.concatenate([p[1] for p in parts])
        docs, inv = np.unique(ids, return_inverse=True)
        # bincount adds in input order, i.e. phrase by phrase, as fts5_aux.c does
        total = np.bincount(inv, weights=sc, minlength=len(docs))
        if len(docs) > k:
            cut = np.partition(total, len(docs) - k)[len(docs) - k]
            keep = total >= cut  # ties at the cut are all kept, then broken by row id
            docs, total = docs[keep], total[keep]
        order = np.lexsort((docs, -total))[:k]
        return docs[order].tolist()
