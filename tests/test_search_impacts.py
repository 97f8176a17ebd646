"""Precomputed BM25 impacts rank exactly as FTS5's bm25() does, and fall back to it when they cannot."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest
from conftest import atom

from atomcli.env import search_impacts, search_local

# A small vocabulary with stemming variants, so that terms collide, repeat within documents,
# occur in titles and bodies, and scores tie.
VOCAB = ["river", "rivers", "museum", "museums", "painter", "painted", "painting", "novel", "city", "cities",
         "born", "founded", "founding", "lake", "press", "karsia", "velmora", "quist", "orlen", "dravenholt",
         "ember", "chronicle", "chronicles", "capital", "observatory", "island", "bridge", "tower"]
FUNCTION = ["the", "of", "in", "was", "a", "and", "which", "by"]


def _corpus(rng: random.Random, n: int) -> list[dict]:
    docs = []
    for i in range(n):
        words = [rng.choice(VOCAB if rng.random() < 0.7 else FUNCTION) for _ in range(rng.randint(3, 40))]
        title = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(0, 3)))
        docs.append({"id": f"d{i}", "title": title, "contents": " ".join(words)})
    return docs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("impacts")
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(x) + "\n" for x in _corpus(random.Random(7), 600)))
    search_local.build_index(str(corpus), str(d / "with.sqlite"))
    search_local.build_index(str(corpus), str(d / "without.sqlite"), impacts=False)
    with_ix, without_ix = search_local.open_index(str(d / "with.sqlite")), search_local.open_index(str(d / "without.sqlite"))
    yield with_ix, without_ix
    with_ix.close()
    without_ix.close()


def _bm25(ix, words, rowid) -> float:
    return ix._con().execute(f"SELECT bm25(fts, {search_local.TITLE_WEIGHT}, {search_local.BODY_WEIGHT}) FROM fts "
                             "WHERE fts MATCH ? AND rowid = ?", (search_local.match_expression(words), rowid)).fetchone()[0]


def test_impacts_choose_the_documents_fts5_ranks_best_with_identical_scores(built):
    ix, _ = built
    assert ix.impacts
    rng = random.Random(1)
    checked = 0
    for _ in range(300):
        words = search_local.query_words(" ".join(rng.choice(VOCAB + ["zzz-unseen"]) for _ in range(rng.randint(1, 6))))
        k = rng.choice([1, 3, 10, 50])
        top = ix.rank_impacts(words, k)
        assert top is not None, words
        reference = ix.rank_fts5(search_local.match_expression(words), k)
        assert len(top) == len(reference)
        # Bit-identical scores, position by position (ties may order rows differently; scores cannot differ).
        assert [_bm25(ix, words, r) for r in top] == [_bm25(ix, words, r) for r in reference]
        # Ties are broken by row id, so the order is deterministic.
        scores = [_bm25(ix, words, r) for r in top]
        assert all((s1, r1) <= (s2, r2) for s1, r1, s2, r2 in zip(scores, top, scores[1:], top[1:]))
        checked += 1
    assert checked == 300


def test_search_results_are_the_same_with_and_without_impacts(built):
    with_ix, without_ix = built
    assert not without_ix.impacts
    rng = random.Random(2)
    for _ in range(100):
        q = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 5)))
        a, b = with_ix.search(q, 5), without_ix.search(q, 5)
        assert [r["snippet"] for r in a] != [] and len(a) == len(b)
        assert sorted(_bm25(with_ix, search_local.query_words(q), _rowid(with_ix, r)) for r in a) == \
            sorted(_bm25(without_ix, search_local.query_words(q), _rowid(without_ix, r)) for r in b)


def _rowid(ix, result) -> int:
    return ix._con().execute("SELECT rowid FROM docs WHERE url = ?", (result["url"],)).fetchone()[0]


@pytest.mark.parametrize("query, why", [
    ("the of which", "function words only: their postings are not stored"),
    ("river_museum", "one word that FTS5 splits into a phrase"),
])
def test_queries_the_impacts_cannot_rank_fall_back_to_fts5(built, query, why):
    ix, _ = built
    words = search_local.query_words(query)
    assert ix.rank_impacts(words, 5) is None, why
    results = ix.search(query, 5)
    assert results, why
    reference = ix.rank_fts5(search_local.match_expression(words), 5)
    assert [_rowid(ix, r) for r in results] == reference


def test_unknown_words_rank_nothing_and_known_ones_still_count(built):
    ix, _ = built
    assert ix.rank_impacts(["qwertyuiop"], 5) == []
    assert ix.search("qwertyuiop", 5) == []
    assert ix.rank_impacts(["qwertyuiop", "observatory"], 5) == \
        ix.rank_fts5(search_local.match_expression(["qwertyuiop", "observatory"]), 5)


def test_no_impacts_flag_builds_an_index_without_them(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(x) + "\n" for x in _corpus(random.Random(3), 20)))
    for flag, expect in (("--impacts", True), ("--no-impacts", False)):
        out = tmp_path / f"{flag}.sqlite"
        proc = atom("index", corpus, "--out", out, flag)
        assert proc.returncode == 0, proc.stderr.decode()
        con = sqlite3.connect(out)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        meta = dict(con.execute("SELECT key, value FROM meta"))
        con.close()
        assert ("impacts" in tables) is expect
        assert (meta.get(search_impacts.META_KEY) == search_impacts.meta_value(search_local.WEIGHTS)) is expect
        assert search_local.open_index(str(out)).impacts is expect


def test_impacts_recipe_mismatch_is_not_used(tmp_path):
    """An index whose impacts were computed with other weights ranks through FTS5."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(x) + "\n" for x in _corpus(random.Random(4), 20)))
    out = tmp_path / "i.sqlite"
    search_local.build_index(str(corpus), str(out))
    con = sqlite3.connect(out)
    con.execute("UPDATE meta SET value = 'bm25 k1=2.0' WHERE key = ?", (search_impacts.META_KEY,))
    con.commit()
    con.close()
    assert not search_local.open_index(str(out)).impacts
