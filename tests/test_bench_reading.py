"""bench/real_docs/reading.py: each answered real-text trajectory is right, copied, lost in reading or not found."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "real_docs" / "reading.py"
QUESTION = "What is the default setting of the defer_foreign_keys pragma?"
SNIPPET = "The defer_foreign_keys pragma defaults to OFF so that foreign key constraints are only deferred if..."


def load():
    spec = importlib.util.spec_from_file_location("reading", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(answer, tool_text=SNIPPET, query="default setting defer_foreign_keys pragma", last="<answer>x</answer>"):
    return {"question": QUESTION, "golden_answers": ["OFF"], "answer": answer,
            "messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "..."},
                         {"role": "tool", "content": tool_text}, {"role": "assistant", "content": last}],
            "tool_calls": [{"turn": 1, "name": "web_search", "arguments": json.dumps({"query": [query]})}]}


def test_classify_each_case():
    mod = load()
    assert mod.classify(row("off")) == ("right", True)  # normalized like the F1 scorer
    assert mod.classify(row("default setting defer_foreign_keys pragma")) == ("copied", True)
    assert mod.classify(row("ON")) == ("lost in reading", True)
    assert mod.classify(row("ON", tool_text="nothing useful here")) == ("not found", False)
    assert mod.classify(row(None)) == ("lost in reading", True)  # no answer at all, with the answer in hand


def test_the_last_turns_quote_holds_the_answer_or_another_sentence_or_nothing():
    mod = load()
    said = '<think><OBSERVATION>For defer_foreign_keys, it reads "{}".</OBSERVATION></think><answer>{}</answer>'
    assert mod.quoted(row("OFF", last=said.format("The defer_foreign_keys pragma defaults to OFF", "OFF"))) \
        == "quote holds it"
    assert mod.quoted(row("ON", last=said.format("foreign key constraints are only deferred", "ON"))) \
        == "quoted another"
    # a quote in the answer itself, or a quoted word, is not a quoted sentence
    assert mod.quoted(row("OFF", last='<think>No quote.</think><answer>"OFF" it is, surely</answer>')) == "no quote"
    assert mod.quoted(row("OFF", last='<think>It says "OFF".</think><answer>OFF</answer>')) == "no quote"


def test_an_anchor_is_a_piece_of_the_quote_named_in_the_last_reflection():
    mod = load()
    said = ('<think><OBSERVATION>It reads "The defer_foreign_keys pragma defaults to OFF".</OBSERVATION>'
            '<REFLECTION>It says "{}", so OFF.</REFLECTION></think><answer>OFF</answer>')
    assert mod.anchor(row("OFF", last=said.format("defaults to OFF"))) == "defaults to OFF"
    assert mod.last_quotes(row("OFF", last=said.format("defaults to OFF"))) == ["The defer_foreign_keys pragma defaults to OFF"]
    assert mod.anchor(row("OFF", last=said.format("not in the quote"))) is None
    assert mod.anchor(row("OFF", last='<think>It reads "The pragma defaults to OFF".</think><answer>OFF</answer>')) is None


def test_cli_counts_and_skips_unanswered_tables(tmp_path):
    answered = tmp_path / "sft.parquet"
    quote = '<think>It reads "The defer_foreign_keys pragma defaults to OFF".</think><answer>OFF</answer>'
    pair = '<think>Two values: "foreign key constraints are only deferred" and "The pragma defaults to OFF".</think>'
    anchored = ('<think><OBSERVATION>It reads "The defer_foreign_keys pragma defaults to OFF".</OBSERVATION>'
                '<REFLECTION>It says "{}", so {}.</REFLECTION></think><answer>x</answer>')
    pq.write_table(pa.Table.from_pylist([row("OFF", last=quote), row("defer_foreign_keys pragma"), row("ON"),
                                         row("ON", tool_text="x"), row("ON", last=pair + "<answer>ON</answer>"),
                                         row("OFF", last=pair + "<answer>OFF</answer>"),
                                         row("OFF", last=anchored.format("defaults to OFF", "OFF")),
                                         row("ON", last=anchored.format("The defer_foreign", "ON"))]), answered)
    questions = tmp_path / "questions.parquet"
    pq.write_table(pa.table({"question": [QUESTION], "golden_answers": [["OFF"]]}), questions)
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", str(questions), str(answered)],
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert (got["n"], got["answer_in_hand"], got["right_in_hand"]) == (8, 7, 3)
    assert (got["right"], got["copied"], got["lost in reading"], got["not found"]) == (3, 1, 3, 1)
    # of the 7 in hand; an anchor phrase in a REFLECTION is not a quoted sentence
    assert (got["quote holds it"], got["quoted another"], got["no quote"]) == (5, 0, 2)
    assert (got["two_quotes"], got["two_quotes_right"]) == (2, 1)
    assert (got["anchored"], got["anchor_holds_it"], got["anchored_right"]) == (2, 1, 1)
    assert "not an answered table" in out.stderr


def test_a_pair_names_the_first_or_the_second_quote():
    mod = load()
    pair = ('<think><OBSERVATION>The results say "Foreign key constraints are immediate by default" but also '
            '"The defer_foreign_keys pragma defaults to OFF".</OBSERVATION><REFLECTION>The question says pragma; '
            'that is the {} sentence, so OFF.</REFLECTION></think><answer>OFF</answer>')
    assert mod.named(row("OFF", last=pair.format("second"))) == "second"
    assert mod.named(row("OFF", last=pair.format("first"))) == "first"
    assert mod.named(row("OFF", last=pair.format("first or second"))) is None  # names both: no pick
    assert mod.named(row("OFF", last=pair.format("right"))) is None
    # the question's own "first" (the {cue} of the template) is not the pick
    cue = pair.replace("The question says pragma", "The question says first statement")
    assert mod.named(row("OFF", last=cue.format("second"))) == "second"
    assert mod.named(row("OFF", last=cue.format("either"))) is None
    said = mod.last_quotes(row("OFF", last=pair.format("second")))
    assert [mod.holds_gold(row("OFF"), s) for s in said] == [False, True]
