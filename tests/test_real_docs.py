"""The shipped real-text benchmark (SQLite's documentation): built offline from package data,
FlashRAG splits, every question verified against its passages, searchable with `atom search`."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import atom

from atomcli.demo import real_docs
from atomcli.env import search_local
from atomcli.errors import InputError


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("real") / "sqlite"
    summary = real_docs.build("sqlite", out)
    return out, summary


def test_packaged_questions_all_verify():
    corpus, questions = real_docs.load("sqlite")
    assert real_docs.verify(questions, corpus) == []
    assert len(questions) >= 120
    hops = Counter(q["hops"] for q in questions)
    assert 0.25 <= hops[2] / len(questions) <= 0.35          # ~70% 1-hop, ~30% 2-hop
    assert len({q["question"] for q in questions}) == len(questions)
    assert all(len(q["support"]) >= q["hops"] for q in questions)
    assert 500 <= len(corpus) and len({d["id"] for d in corpus}) == len(corpus)
    assert all(d["id"].startswith("sqlite/") and d["title"] and d["contents"] for d in corpus)


def test_verify_catches_each_broken_rule():
    corpus = [{"id": "p#0", "title": "T", "contents": "The default is 1,000 pages."}]
    good = {"id": "q", "question": "What is the default?", "golden_answers": ["1000", "1,000"],
            "hops": 1, "support": ["p#0"], "split": "train", "data_source": "x"}
    assert real_docs.verify([good], corpus) == []
    broken = [
        {**good, "golden_answers": ["2000"]},                   # not in the passage
        {**good, "question": "Is the default 1000?"},           # answer in the question
        {**good, "support": ["p#9"]},                            # unknown passage
        {**good, "hops": 2},                                      # 2 hops, 1 passage
        {**good, "split": "dev"},
    ]
    for q in broken:
        assert real_docs.verify([q], corpus), q
    assert any("duplicate" in p for p in real_docs.verify([good, good], corpus))


def test_build_writes_flashrag_splits_and_an_index(built):
    out, summary = built
    assert sorted(p.name for p in out.iterdir()) == ["corpus.jsonl", "index.sqlite", "test.jsonl", "train.jsonl"]
    _, questions = real_docs.load("sqlite")
    train, test = read_jsonl(out / "train.jsonl"), read_jsonl(out / "test.jsonl")
    assert len(train) + len(test) == len(questions) == summary["train"] + summary["test"]
    # the first 139 questions split ~60/40, stratified by hops; the supplement sqlite_140-599 is train only, and
    # sqlite_600 on is test only, on pages that no training question uses
    num = lambda q: int(q["id"].rsplit("_", 1)[1])
    first = [q for q in questions if num(q) < 140]
    later_test = [q for q in questions if num(q) >= 600]
    assert len(first) == 139 and len(test) == 115 and len(later_test) == 60
    assert all(q["split"] == "train" for q in questions if 140 <= num(q) < 600)
    assert all(q["split"] == "test" for q in later_test)
    assert 0.35 <= sum(q["split"] == "test" for q in first) / len(first) <= 0.45
    for split in ([q for q in first if q["split"] == "train"], test):
        share = sum(r["hops"] == 2 for r in split) / len(split)
        assert 0.2 <= share <= 0.4
    page = lambda passage: passage.split("#")[0]
    train_pages = {page(s) for q in questions if q["split"] == "train" for s in q["support"]}
    assert not {page(s) for q in later_test for s in q["support"]} & train_pages
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for r in train + test:
        assert set(r) == {"id", "question", "golden_answers", "data_source", "hops"}
        assert r["hops"] in (1, 2) and r["data_source"] == f"sqlite_{r['hops']}hop"
        assert r["golden_answers"] and all(isinstance(g, str) and g for g in r["golden_answers"])
    by_id = {q["id"]: q for q in questions}
    assert all(by_id[r["id"]]["split"] == name for name, rows in (("train", train), ("test", test)) for r in rows)
    docs = read_jsonl(out / "corpus.jsonl")
    assert len(docs) == summary["passages"]
    assert all(set(d) == {"id", "title", "contents"} for d in docs)


def test_same_package_same_bytes(built, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    real_docs.build("sqlite", again)
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name


def test_search_finds_the_supporting_passage(built):
    out, _ = built
    index = search_local.LocalIndex(str(out / "index.sqlite"))
    try:
        res = index.search("default value SQLITE_MAX_COLUMN", 3)
        assert res and all(r["url"].startswith(search_local.LOCAL_PREFIX) for r in res)
        page = index.read_local(res[0]["url"])
        assert "SQLITE_MAX_COLUMN" in page and "2000" in page
    finally:
        index.close()
    proc = atom("search", "--index", out / "index.sqlite", "--format", "json", "-k", "3", "PRAGMA cache_size default")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "cache_size" in proc.stdout.decode()


def test_cli_builds_and_refuses(tmp_path):
    out = tmp_path / "bench"
    proc = atom("demo-world", "--real", "sqlite", "--out", out)
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""
    assert (out / "index.sqlite").exists() and read_jsonl(out / "test.jsonl")
    assert atom("demo-world", "--real", "sqlite", "--out", out).returncode == 0   # rebuilding in place is fine
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    proc = atom("demo-world", "--real", "sqlite", "--out", busy)
    assert proc.returncode == 2 and (busy / "keep.txt").read_text() == "mine"
    proc = atom("demo-world", "--real", "nope", "--out", tmp_path / "x")
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "nope" in err and "sqlite" in err and not (tmp_path / "x").exists()


def test_unknown_name_is_a_usage_error(tmp_path):
    with pytest.raises(InputError, match="valid: sqlite"):
        real_docs.build("python", tmp_path / "x")
