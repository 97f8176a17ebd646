"""`atom show`: the terminal view (question, turns, tags, scores, rewards), the self-contained
HTML page that escapes model text, row selection and bad rows."""

from __future__ import annotations

import io

import orjson
import pyarrow as pa
import pytest
from conftest import atom

from atomcli import schema
from atomcli.stages import show

EVIL = "<script>alert('x')</script>"


def _traj(i, *, question, answer, thoughts, scores=None, obs="Results for \"x\": 1. Page"):
    turn1 = ("<think>" + "".join(f"<{t}>{b}</{t}>" for t, b in thoughts) + "</think>"
             '<tool_call>{"name": "web_search", "arguments": {"query": ["capital of France"]}}</tool_call>')
    turn2 = f"<think><REFLECTION>found it</REFLECTION></think><answer>{answer}</answer>"
    rec = {"id": f"q{i}", "question": question, "golden_answers": ["Paris"], "data_source": "demo",
           "traj_id": f"q{i}/0", "messages": [
               {"role": "system", "content": "You are a research agent."},
               {"role": "user", "content": f"Question: {question}"},
               {"role": "assistant", "content": turn1},
               {"role": "tool", "content": f"<tool_response>\n{obs}\n</tool_response>"},
               {"role": "assistant", "content": turn2}],
           "answer": answer, "finish_reason": "answer", "format_ok": True, "n_turns": 2,
           "f1": 1.0, "reward": 0.75, "advantage": -0.5, "alpha": 0.25, "atr": 0.5}
    if scores is not None:
        units = list(thoughts) + [("REFLECTION", "found it")]
        rec["atomic_thoughts"] = [{"turn": 1 if k < len(thoughts) else 2, "tag": t, "text": b, "score": s}
                                  for k, ((t, b), s) in enumerate(zip(units, scores))]
    return rec


def rows():
    return [
        _traj(0, question="What is the capital of France?", answer="Paris",
              thoughts=[("PLAN", "search the capital"), ("RISK_ANALYSIS", "might be outdated")], scores=[9.0, 1.0, 5.0]),
        _traj(1, question=f"Evil {EVIL} question?", answer=f"Paris {EVIL}",
              thoughts=[("OBSERVATION", f"the page says {EVIL} [bold red]markup[/]")], scores=[3.0, 7.0],
              obs=f"page with {EVIL} " + "x" * 5000),
    ]


@pytest.fixture
def table_file(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows()))
    return p


def _text(views):
    from rich.console import Console
    buf = io.StringIO()
    show.print_views(views, Console(file=buf, width=200, highlight=False))
    return buf.getvalue()


def test_view_matches_scored_thoughts_to_turns_and_scales_scores():
    recs = rows()
    scale = show._score_scale(recs)
    assert scale == 10.0  # score-rrm's 0-10 judge scale
    v = show.trajectory_view(recs[0], 0, scale)
    assistant = [t for t in v["turns"] if t["kind"] == "assistant"]
    assert [(tag, score, u) for tag, _, score, u in assistant[0]["thoughts"]] == [("PLAN", 9.0, 0.9),
                                                                               ("RISK_ANALYSIS", 1.0, 0.1)]
    assert assistant[1]["thoughts"][0][2] == 5.0 and assistant[1]["answer"] == "Paris"
    assert "web_search" in assistant[0]["tool_call"] and v["unmatched_thoughts"] == []
    assert [t["role"] for t in v["turns"] if t["kind"] == "message"] == ["tool"]
    assert v["rewards"]["advantage"] == -0.5 and v["stats"]["finish_reason"] == "answer"


def test_score_scale_is_0_to_10_unless_all_scores_are_fractions():
    def recs(*scores):
        return [{"atomic_thoughts": [{"tag": "PLAN", "text": "t", "score": s} for s in scores]}]
    assert show._score_scale(recs(0.0, 1.0)) == 10.0  # integer judge scores that happen to be low
    assert show._score_scale(recs(0.25, 0.9)) == 1.0
    assert show._score_scale(recs(None)) == 10.0 and show._score_scale([{}]) == 10.0


def test_colours_run_from_red_to_green():
    r0, g0, _ = show._rgb(0.0)
    r1, g1, _ = show._rgb(1.0)
    assert r0 > g0 and g1 > r1


def test_unscored_table_still_renders_its_thoughts():
    rec = rows()[0]
    del rec["atomic_thoughts"]
    v = show.trajectory_view(rec, 0, show._score_scale([rec]))
    first = next(t for t in v["turns"] if t["kind"] == "assistant")
    assert [(tag, score) for tag, _, score, _ in first["thoughts"]] == [("PLAN", None), ("RISK_ANALYSIS", None)]


def test_terminal_text_has_question_answer_tags_scores_and_rewards():
    out = _text([show.trajectory_view(r, i, 10.0) for i, r in enumerate(rows())])
    assert "What is the capital of France?" in out and "golden:   Paris" in out
    assert "<PLAN> 9 search the capital" in out and "<RISK_ANALYSIS> 1" in out
    assert "answer: Paris" in out and "reward=0.750" in out and "advantage=-0.500" in out
    assert "format_ok=True" in out and "finish_reason=answer" in out
    assert "[bold red]markup[/]" in out  # model text is never interpreted as rich markup
    assert "more chars)" in out  # the 5000-char observation is truncated


def test_cli_show_prints_to_stdout(table_file):
    proc = atom("show", table_file, check=True)
    out = proc.stdout.decode()
    assert "What is the capital of France?" in out and "<PLAN>" in out and "answer: Paris" in out
    assert "row 1" in out
    one = atom("show", table_file, "--row", "1", check=True).stdout.decode()
    assert "row 1" in one and "capital of France?" not in one


def test_cli_html_is_self_contained_and_escapes_model_text(table_file, tmp_path):
    page_path = tmp_path / "out" / "page.html"
    proc = atom("show", table_file, "--html", page_path, check=True)
    assert proc.stdout == b""
    page = page_path.read_text()
    assert "<script" not in page.lower()  # the evil text appears only escaped
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "default-src 'none'" in page  # CSP: no scripts, no fetches
    assert "<style>" in page and "src=" not in page and "<link" not in page and "@import" not in page
    assert "http://" not in page and "https://" not in page
    assert "What is the capital of France?" in page and "RISK_ANALYSIS" in page and "row 1" in page
    assert "rgb(" in page  # scored thoughts are coloured


def test_cli_html_single_row(table_file, tmp_path):
    atom("show", table_file, "--row", "0", "--html", tmp_path / "p.html", check=True)
    page = (tmp_path / "p.html").read_text()
    assert "row 0" in page and "Evil" not in page


@pytest.mark.parametrize("row", ["2", "-1"])
def test_cli_bad_row_exits_2(table_file, tmp_path, row):
    proc = atom("show", table_file, "--row", row, "--html", tmp_path / "p.html")
    assert proc.returncode == 2 and b"row" in proc.stderr and b"2 rows" in proc.stderr
    assert not (tmp_path / "p.html").exists()


def test_questions_table_shows_without_messages(tmp_path):
    t = schema.conform(pa.table({"id": ["a"], "question": ["Who?"], "golden_answers": [["Bob"]]}))
    v = show.trajectory_view(t.to_pylist()[0], 0)
    assert v["turns"] == [] and not v["has_answer"]
    text = _text([v])
    assert "Who?" in text and "Bob" in text and "answer:" not in text
    assert "Who?" in show.to_html([v])
