"""The local search engine: `atom index`, BM25 retrieval, local urls, odd queries, bad corpora."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import atom
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atomcli import plugins
from atomcli.context import Context
from atomcli.env import search_local
from atomcli.errors import InputError

DOCS = [
    {"id": "p1", "title": "Velmora Quist", "contents": "Velmora Quist is a painter from Karsia. She was born in "
     "Dravenholt in 1872. She founded the Orlenic Press in 1903."},
    {"id": "o 2/x", "title": "Orlenic Press", "contents": "The Orlenic Press is a publishing house in Dravenholt, "
     "founded in 1903 by Velmora Quist. It published Ember Chronicles."},
    {"id": "c3", "title": "Dravenholt", "contents": "Dravenholt is a city in Karsia, founded in 1210.",
     "url": "https://example.org/wiki/Dravenholt"},
    {"id": 4, "title": "Ember Chronicles", "contents": "Ember Chronicles is a novel by Tasso Brindlemark, "
     "published by the Orlenic Press in 1921."},
    {"id": "k5", "title": "Karsia", "contents": "Karsia is a country whose capital is Lunetmoor. Zürich-like "
     "lakes and the café culture of Lunetmoor are well known."},
]


def write_jsonl(path, rows):
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    stats = search_local.build_index(str(write_jsonl(d / "corpus.jsonl", DOCS)), str(d / "index.sqlite"))
    assert stats["documents"] == len(DOCS)
    ix = search_local.open_index(str(d / "index.sqlite"))
    yield ix
    ix.close()


@pytest.mark.parametrize("query, title", [
    ("Velmora Quist", "Velmora Quist"),
    ("Orlenic Press", "Orlenic Press"),
    ("who wrote Ember Chronicles?", "Ember Chronicles"),
    ("capital of Karsia", "Karsia"),
    ("dravenholt", "Dravenholt"),                   # case-insensitive
])
def test_title_query_ranks_its_document_first(index, query, title):
    results = index.search(query, 3)
    assert results[0]["title"] == title
    assert set(results[0]) == {"title", "url", "snippet", "score", "id"}
    assert [r["score"] for r in results] == sorted((r["score"] for r in results), reverse=True)
    assert len(results) <= 3


def test_porter_stemming_and_diacritics_match(index):
    assert index.search("publishing houses", 1)[0]["title"] == "Orlenic Press"   # houses -> house
    assert index.search("Zurich cafe", 1)[0]["title"] == "Karsia"                # diacritics folded


def test_snippet_is_a_window_of_the_best_matching_text(tmp_path):
    filler = " ".join(f"word{i}" for i in range(120))
    doc = {"id": "long", "title": "Long page", "contents": f"{filler} the Quellstone treaty was signed here. {filler}"}
    search_local.build_index(str(write_jsonl(tmp_path / "c.jsonl", [doc])), str(tmp_path / "i.sqlite"))
    [hit] = search_local.open_index(str(tmp_path / "i.sqlite")).search("Quellstone treaty", 5)
    words = hit["snippet"].split()
    assert "Quellstone" in hit["snippet"] and 30 <= len(words) <= 60, hit["snippet"]


def test_order_snippet_puts_the_sentences_with_most_query_words_first():
    snip = ("…began in 1903. The default page size is 4096 bytes. The maximum page size is 65536 bytes. "
            "Page sizes are powers of two between…")
    got = search_local.order_snippet(snip, ["maximum", "page", "size"])
    # 3 words (maximum, page, size), then 2 (page, size) in page order; the cut fragments keep their "…"
    assert got == ("The maximum page size is 65536 bytes. The default page size is 4096 bytes. Page sizes are "
                   "powers of two between… …began in 1903."), got
    assert sorted(got.split()) == sorted(snip.split())  # the same words, each "…" on its fragment
    # stems: "defaults" matches "default"; no query word anywhere leaves page order
    assert search_local.order_snippet(snip, ["defaults"]).startswith("The default page size")
    assert search_local.order_snippet(snip, ["zebra"]) == snip
    assert search_local.order_snippet("One sentence only…", ["only"]) == "One sentence only…"


def test_query_ordered_snippets_change_order_not_results(tmp_path):
    doc = {"id": "lim", "title": "Limits", "contents": "Limits are set at compile time. The default page size "
           "is 4096 bytes. The maximum page size is 65536 bytes. Both can be changed."}
    other = {"id": "x", "title": "Other", "contents": "A page about something else with a maximum."}
    search_local.build_index(str(write_jsonl(tmp_path / "c.jsonl", [doc, other])), str(tmp_path / "i.sqlite"))
    ctx = Context(quiet=True)
    text = ctx.search(f"local:{tmp_path / 'i.sqlite'}")
    query = ctx.search(f"local:{tmp_path / 'i.sqlite'}", snippets="query")
    assert query is not text and query.name != text.name  # another engine output: another cache key
    a, b = text.search("maximum page size", 5), query.search("maximum page size", 5)
    assert [(r["id"], r["score"], r["title"], r["url"]) for r in a] == [(r["id"], r["score"], r["title"], r["url"])
                                                                        for r in b]
    assert a[0]["snippet"].startswith("Limits are set") and b[0]["snippet"].startswith("The maximum page size")
    assert sorted(a[0]["snippet"].split()) == sorted(b[0]["snippet"].split())
    with pytest.raises(InputError, match=r"unknown snippets order `bogus`.*valid: query, text"):
        plugins.make_search(f"local:{tmp_path / 'i.sqlite'}", ctx, snippets="bogus")


def test_local_urls_and_read_local_round_trip(index):
    by_title = {r["title"]: r["url"] for r in index.search("Velmora Quist Orlenic Press Dravenholt Ember", 10)}
    assert by_title["Orlenic Press"] == "local://doc/o%202%2Fx"          # id url-quoted
    assert by_title["Dravenholt"] == "https://example.org/wiki/Dravenholt"  # the corpus's own url is kept
    assert by_title["Ember Chronicles"] == "local://doc/4"               # integer ids become strings
    for d in DOCS:
        url = d.get("url") or search_local.local_url(str(d["id"]))
        assert index.read_local(url) == f"{d['title']}\n\n{d['contents']}"
    assert index.read_local("local://doc/nope") is None
    assert index.read_local("https://example.org/other") is None
    assert index.read_local(None) is None


@pytest.mark.parametrize("query", ['"', '""', "AND", "OR NOT", "*", "a*", "NEAR(a b)", "title:Karsia",
                                   "^Velmora", "(", ")", "-", "+Velmora -Quist", "é ü 北京 🙂", "", "   ",
                                   "\x00", "\ud800", "the of and", "x" * 10000, "Velmora" + " q" * 500, "___"])
def test_odd_queries_never_raise(index, query):
    results = index.search(query, 5)
    assert isinstance(results, list) and len(results) <= 5


def test_fts_syntax_is_taken_as_words(index):
    assert index.search('title:"Karsia" AND NOT', 1)[0]["title"] == "Karsia"
    assert index.search("Orlenic*", 5) and index.search("", 5) == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_any_text_is_a_valid_query(index, query):
    assert isinstance(index.search(query, 3), list)


def test_safe_from_a_thread_pool(index):
    queries = ["Velmora Quist", "Orlenic Press", "Karsia capital", "Ember", "Dravenholt 1210"] * 20
    expected = [index.search(q, 3) for q in queries]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: index.search(q, 3), queries))
        pages = list(pool.map(index.read_local, ["local://doc/p1"] * 40))
    assert got == expected
    assert len(set(pages)) == 1 and pages[0].startswith("Velmora Quist")


def test_registered_as_the_local_backend(tmp_path, index):
    ctx = Context(quiet=True)
    backend = ctx.search("local:" + index.path)
    assert backend.search("Karsia", 1)[0]["title"] == "Karsia"
    assert ctx.search("local:" + index.path) is backend          # loaded once per context
    with pytest.raises(InputError, match="not found"):
        plugins.make_search(f"local:{tmp_path / 'missing.sqlite'}", ctx)
    with pytest.raises(InputError, match="needs an index path"):
        plugins.make_search("local:", ctx)
    (tmp_path / "junk.sqlite").write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(InputError, match="not an atomcli search index"):
        plugins.make_search(f"local:{tmp_path / 'junk.sqlite'}", ctx)


def test_parquet_corpus_with_text_column_and_flashrag_titles(tmp_path):
    # FlashRAG / Search-R1 wiki dumps: no title column, the first line of contents is "Title"
    table = pa.table({"id": ["w1", "w2"], "text": ['"Lunetmoor"\nLunetmoor is the capital of Karsia.',
                                                   "no title line here"]})
    pq.write_table(table, tmp_path / "wiki.parquet")
    search_local.build_index(str(tmp_path / "wiki.parquet"), str(tmp_path / "i.sqlite"))
    ix = search_local.open_index(str(tmp_path / "i.sqlite"))
    top = ix.search("Lunetmoor", 1)[0]
    assert top["title"] == "Lunetmoor" and top["snippet"] == "Lunetmoor is the capital of Karsia."
    assert ix.read_local("local://doc/w2") == "no title line here"


def test_atom_index_cli_builds_a_searchable_index(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", DOCS)
    proc = atom("index", corpus, "--out", tmp_path / "out" / "index.sqlite")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout == b""                                   # stdout is for data only
    assert b"indexed" in proc.stderr and b"5 documents" in proc.stderr
    ix = search_local.open_index(str(tmp_path / "out" / "index.sqlite"))
    assert ix.search("Lunetmoor capital", 1)[0]["title"] == "Karsia"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.sqlite"]   # no temp files left


def test_atom_index_reads_stdin(tmp_path):
    data = b"".join(json.dumps(d).encode() + b"\n" for d in DOCS)
    proc = atom("index", "-", "--out", tmp_path / "i.sqlite", input=data)
    assert proc.returncode == 0, proc.stderr.decode()
    assert search_local.open_index(str(tmp_path / "i.sqlite")).documents == len(DOCS)


BAD = [
    ("missing id", b'{"id": "a", "contents": "x"}\n{"title": "t", "contents": "y"}\n', "line 2", "`id`"),
    ("missing contents", b'{"id": "a", "contents": "x"}\n\n{"id": "b", "title": "t"}\n', "line 3", "contents"),
    ("empty corpus", b"", "no documents", None),
    ("blank lines only", b"\n\n  \n", "no documents", None),
    ("non-UTF-8 line", b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": "caf\xe9"}\n', "line 2", "UTF-8"),
    ("bad JSON line", b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": \n', "line 2", "JSON"),
    ("not an object", b'["a", "b"]\n', "line 1", "JSON object"),
    ("duplicate id", b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": "y"}\n{"id": "a", "contents": "z"}\n',
     "line 3", "duplicate"),
    ("non-text contents", b'{"id": "a", "contents": 12}\n', "line 1", "contents"),
]


@pytest.mark.parametrize("case, data, where, what", BAD, ids=[b[0] for b in BAD])
def test_bad_corpus_exits_2_naming_file_and_line_and_leaves_no_index(tmp_path, case, data, where, what):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    proc = atom("index", corpus, "--out", out / "index.sqlite")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert str(corpus) in err and where in err, err
    assert what is None or what in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(out.iterdir()) == []                           # no index, no temporary file


def test_parquet_corpus_without_id_column_fails(tmp_path):
    pq.write_table(pa.table({"title": ["t"], "contents": ["c"]}), tmp_path / "c.parquet")
    proc = atom("index", tmp_path / "c.parquet", "--out", tmp_path / "i.sqlite")
    assert proc.returncode == 2 and b"no `id` column" in proc.stderr
    assert not (tmp_path / "i.sqlite").exists()


def test_failed_rebuild_keeps_the_previous_index(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", DOCS)
    out = tmp_path / "i.sqlite"
    search_local.build_index(str(good), str(out))
    before = out.read_bytes()
    (tmp_path / "bad.jsonl").write_bytes(b'{"id": "a", "contents": "x"}\n{oops\n')
    with pytest.raises(InputError, match="line 2"):
        search_local.build_index(str(tmp_path / "bad.jsonl"), str(out))
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl", "i.sqlite"]


def test_same_corpus_gives_identical_index_bytes(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    (tmp_path / "a").mkdir()
    search_local.build_index(str(corpus), str(tmp_path / "a" / "i.sqlite"))
    search_local.build_index(str(corpus), str(tmp_path / "i.sqlite"))
    assert (tmp_path / "a" / "i.sqlite").read_bytes() == (tmp_path / "i.sqlite").read_bytes()


def test_unknown_engine_and_stdout_output_are_usage_errors(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", DOCS)
    proc = atom("index", corpus, "--out", tmp_path / "i.sqlite", "--engine", "lucene")
    assert proc.returncode == 2 and b"fts5" in proc.stderr
    proc = atom("index", corpus, "--out", "-")
    assert proc.returncode == 2 and proc.stdout == b""
