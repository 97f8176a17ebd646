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


def row(answer, tool_text=SNIPPET, query="default setting defer_foreign_keys pragma"):
    return {"question": QUESTION, "golden_answers": ["OFF"], "answer": answer,
            "messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "..."},
                         {"role": "tool", "content": tool_text}],
            "tool_calls": [{"turn": 1, "name": "web_search", "arguments": json.dumps({"query": [query]})}]}


def test_classify_each_case():
    mod = load()
    assert mod.classify(row("off")) == ("right", True)  # normalized like the F1 scorer
    assert mod.classify(row("default setting defer_foreign_keys pragma")) == ("copied", True)
    assert mod.classify(row("ON")) == ("lost in reading", True)
    assert mod.classify(row("ON", tool_text="nothing useful here")) == ("not found", False)
    assert mod.classify(row(None)) == ("lost in reading", True)  # no answer at all, with the answer in hand


def test_cli_counts_and_skips_unanswered_tables(tmp_path):
    answered = tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist([row("OFF"), row("defer_foreign_keys pragma"), row("ON"),
                                         row("ON", tool_text="x")]), answered)
    questions = tmp_path / "questions.parquet"
    pq.write_table(pa.table({"question": [QUESTION], "golden_answers": [["OFF"]]}), questions)
    out = subprocess.run([sys.executable, str(SCRIPT), "--json", str(questions), str(answered)],
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert (got["n"], got["answer_in_hand"], got["right_in_hand"]) == (4, 3, 1)
    assert (got["right"], got["copied"], got["lost in reading"], got["not found"]) == (1, 1, 1, 1)
    assert "not an answered table" in out.stderr
