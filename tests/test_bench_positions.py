"""bench/real_docs/shuffle_results.py and positions.py: search results reordered in SFT rows, and where quotes sit."""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

BENCH = Path(__file__).resolve().parents[1] / "bench" / "real_docs"
RESPONSE = ('<tool_response>\nResults for "default limit columns":\n'
            "1. Limits In SQLite: Maximum Number Of Columns\n   url: local://doc/a\n"
            "   The default setting for SQLITE_MAX_COLUMN is 2000. You can change it…\n"
            "2. Limits In SQLite: Maximum Length Of A String\n   url: local://doc/b\n"
            "   The maximum number of bytes in a string is 1000000000…\n"
            "3. Compile-time Options\n   url: local://doc/c\n   SQLITE_MAX_COLUMN=N sets the limit…\n"
            "</tool_response>")
PAGE = "<tool_response>\nPage local://doc/a:\nLimits In SQLite\n1. The default is 2000.\n</tool_response>"


def load(name):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def items(text):
    """{title: position} of a search response."""
    return {m.group(2): int(m.group(1)) for m in re.finditer(r"(?m)^(\d+)\. (.*)$", text)}


def test_shuffle_keeps_every_result_and_renumbers():
    mod = load("shuffle_results")
    seen = set()
    for seed in range(12):
        out = mod.shuffle_response(RESPONSE, random.Random(seed))
        assert out.startswith('<tool_response>\nResults for "default limit columns":\n1. ')
        assert out.endswith("…\n</tool_response>") and len(out) == len(RESPONSE)
        assert [int(n) for n in re.findall(r"(?m)^(\d+)\. ", out)] == [1, 2, 3]
        # each result keeps its url and snippet under its title
        for title, url in (("Maximum Number Of Columns", "a"), ("Compile-time Options", "c")):
            block = out.split(title, 1)[1].split("\n")[1]
            assert block == f"   url: local://doc/{url}"
        seen.add(tuple(sorted(items(out), key=items(out).get)))
    assert len(seen) > 1  # the order does change
    assert mod.shuffle_response(PAGE, random.Random(0)) == PAGE  # a page is not a list of results


def test_shuffle_script_touches_only_real_rows_tool_turns(tmp_path):
    mod = load("shuffle_results")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "search"},
            {"role": "tool", "content": RESPONSE}, {"role": "assistant", "content": '"The default" <answer>2000</answer>'}]
    rows = [{"id": f"r{i}", "data_source": src, "messages": msgs} for i, src in
            enumerate(["sqlite_1hop"] * 8 + ["demo_1hop"] * 4)]
    src, dest = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    mod.main([str(src), str(dest), "--p", "1"])
    out = pq.read_table(dest).to_pylist()
    assert [r["messages"][i] == rows[0]["messages"][i] for r in out for i in (0, 1, 3)] == [True] * 36
    assert all(r["messages"][2]["content"] == RESPONSE for r in out[8:])  # demo rows as they were
    assert any(r["messages"][2]["content"] != RESPONSE for r in out[:8])
    mod.main([str(src), str(dest), "--p", "0"])
    assert pq.read_table(dest).to_pylist() == rows


def test_positions_of_answer_and_quote():
    mod = load("positions")
    def row(last, response=RESPONSE, gold="2000"):
        return {"golden_answers": [gold], "messages": [{"role": "assistant", "content": "s"},
                                                       {"role": "tool", "content": response},
                                                       {"role": "assistant", "content": last}]}
    assert mod.positions(row('It says "The default setting for SQLITE_MAX_COLUMN is 2000". <answer>2000</answer>')) == (1, 1)
    assert mod.positions(row('"The maximum number of bytes in a string" <answer>1000000000</answer>')) == (1, 2)
    assert mod.positions(row("<answer>2000</answer>")) == (1, "none")
    assert mod.positions(row('"The default is 2000." <answer>2000</answer>', response=PAGE)) == (0, 0)
    assert mod.positions(row('"not in any result at all" <answer>9</answer>', gold="9")) == (None, None)
    assert mod.positions({"golden_answers": ["x"], "messages": []}) is None


def test_sentences_reordered_inside_each_snippet_keeping_quotes_whole():
    mod = load("shuffle_results")
    item = ("1. Limits\n   url: local://doc/a\n   …The limit is set at compile time. The default setting for "
            "SQLITE_MAX_COLUMN is 2000. It can be lowered at run-time. Beyond that…\n")
    sentences = {"The limit is set at compile time.", "The default setting for SQLITE_MAX_COLUMN is 2000.",
                 "It can be lowered at run-time."}
    orders = set()
    for seed in range(20):
        out = mod.shuffle_snippet(item, random.Random(seed), ["The default setting for SQLITE_MAX_COLUMN is 2000"])
        head, snippet = out.rsplit("\n   ", 1)
        assert head == "1. Limits\n   url: local://doc/a" and out.endswith("…\n") and snippet.startswith("…")
        assert all(s in snippet for s in sentences) and len(out) == len(item)
        orders.add(snippet)
    assert len(orders) > 1
    # a quote that spans two of the splitter's sentences is never cut: orders that would cut it keep the snippet
    keep = ["set at compile time. The default setting"]
    outs = [mod.shuffle_snippet(item, random.Random(s), keep) for s in range(10)]
    assert all(keep[0] in o for o in outs) and item in outs
    out = mod.shuffle_response(RESPONSE, random.Random(3), sentences=True)
    assert sorted(re.findall(r"(?m)^\d+\. (.*)$", out)) == sorted(re.findall(r"(?m)^\d+\. (.*)$", RESPONSE))


def test_sentence_places_inside_the_answers_result():
    mod = load("positions")
    def row(last):
        return {"golden_answers": ["2000"], "question": "What is the default setting for SQLITE_MAX_COLUMN?",
                "messages": [{"role": "assistant", "content": "s"},
                                                         {"role": "tool", "content": RESPONSE},
                                                         {"role": "assistant", "content": last}]}
    # the first sentence holds the answer and shares the question's words (default, setting, sqlite_max_column)
    assert mod.sentence_places(row('"The default setting for SQLITE_MAX_COLUMN is 2000" <answer>2000</answer>')) == (0, 0, {0})
    assert mod.sentence_places(row('"You can change it" <answer>it</answer>')) == (0, 1, {0})
    assert mod.sentence_places(row('"The maximum number of bytes in a string" <answer>1</answer>')) is None  # result 2
    assert mod.sentence_places(row("<answer>2000</answer>")) is None  # no quote
