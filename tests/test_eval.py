"""`atom eval`: metrics per source checked against hand-computed values, matching by id,
judge accounting, the report files, and bad input (exit 2, nothing written)."""

from __future__ import annotations

import json
import random

import orjson
import pyarrow as pa
import pytest
from conftest import atom

from atomcli import plugins, schema, tableio
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import evaluate, evaluate_io, rollout


def _row(qid, source, golden, answer, *, fmt=True, turns=2, search=1, browse=0, n_comp=10, n_gen=4, sample=0):
    return {"id": qid, "question": f"question {qid}?", "golden_answers": golden, "data_source": source,
            "traj_id": f"{qid}/{sample}", "group_id": qid, "sample_idx": sample, "policy": "tiny",
            "messages": [{"role": "user", "content": f"Question: question {qid}?"},
                         {"role": "assistant", "content": f"<think>t</think><answer>{answer}</answer>"}],
            "answer": answer, "format_ok": fmt, "n_turns": turns, "n_search": search, "n_browse": browse,
            "completion_ids": list(range(n_comp)), "loss_mask": [1] * n_gen + [0] * (n_comp - n_gen)}


def rollout_rows():
    """Hand-checked values are in the comments (token F1, SQuAD normalization)."""
    return [
        _row("q1", "nq", ["Paris"], "Paris", turns=2, search=1, n_comp=10, n_gen=4),                # f1 1, em 1, cover 1
        _row("q2", "nq", ["Barack Obama", "Obama"], "President Barack Obama",                      # f1 .8, em 0, cover 1
             fmt=False, turns=3, search=2, browse=1, n_comp=20, n_gen=6),
        _row("q3", "hotpot", ["the Eiffel Tower"], "Eiffel Tower", turns=1, search=0, n_comp=6, n_gen=6),  # 1, 1, 1
        _row("q3", "hotpot", ["the Eiffel Tower"], None, fmt=False, turns=5, search=4, browse=2,           # 0, 0, 0
             n_comp=30, n_gen=10, sample=1),
        _row("q4", "hotpot", ["1889"], "in 1889 or 1890", turns=2, search=1, n_comp=8, n_gen=2),   # f1 .4, em 0, cover 1
    ]


def table_of(rows):
    return pa.table({c: schema.array(c, [r.get(c) for r in rows]) for c in rows[0]})


def _without_time(report):
    return {k: v for k, v in report.items() if k != "time"}


def test_metrics_per_source_match_hand_computed_values():
    rep = evaluate.score_table(table_of(rollout_rows()), "token")
    assert rep["n"] == 4 and rep["n_trajectories"] == 5
    nq, hp, ov = rep["by_source"]["nq"], rep["by_source"]["hotpot"], rep["overall"]
    assert set(rep["by_source"]) == {"nq", "hotpot"}
    # q3 is a group of two: its value is the mean of its samples (0.5), best_f1 its max (1.0)
    assert nq["f1"] == pytest.approx(0.9) and nq["em"] == pytest.approx(0.5) and nq["cover_em"] == pytest.approx(1.0)
    assert hp["f1"] == pytest.approx(0.45) and hp["em"] == pytest.approx(0.25) and hp["cover_em"] == pytest.approx(0.75)
    assert hp["best_f1"] == pytest.approx(0.7) and nq["best_f1"] == pytest.approx(0.9)
    assert ov["f1"] == pytest.approx(0.675) and ov["em"] == pytest.approx(0.375)
    assert ov["cover_em"] == pytest.approx(0.875) and ov["best_f1"] == pytest.approx(0.8)
    assert (nq["n"], hp["n"], hp["n_trajectories"]) == (2, 2, 3)
    assert hp["samples_per_question"] == pytest.approx(1.5)
    # format errors per question: q1 0, q2 1, q3 0.5, q4 0
    assert nq["format_error_rate"] == pytest.approx(0.5) and ov["format_error_rate"] == pytest.approx(0.375)
    # turns per question: 2, 3, (1+5)/2, 2; searches: 1, 2, 2, 1; browses: 0, 1, 1, 0
    assert ov["mean_turns"] == pytest.approx(2.5) and ov["searches_per_question"] == pytest.approx(1.5)
    assert ov["browses_per_question"] == pytest.approx(0.5)
    # tokens: len(completion_ids) 10, 20, 18, 8; generated (loss_mask sum) 4, 6, 8, 2
    assert ov["tokens_per_question"] == pytest.approx(14.0) and ov["generated_tokens_per_question"] == pytest.approx(5.0)
    assert ov["judge_accuracy"] is None and ov["judge_errors"] is None


def test_set_f1_variant_keeps_articles():
    rows = [_row("q3", "hotpot", ["the Eiffel Tower"], "Eiffel Tower")]
    assert evaluate.score_table(table_of(rows), "token")["overall"]["f1"] == pytest.approx(1.0)
    # DeepResearcher's set F1 keeps "the": P = 1, R = 2/3 -> 0.8
    assert evaluate.score_table(table_of(rows), "set")["overall"]["f1"] == pytest.approx(0.8)


def test_shuffled_rows_give_an_identical_report():
    rows = rollout_rows() + [_row(f"x{i}", "nq", ["a b c"], "a b" if i % 3 else "c d", sample=i % 2) for i in range(30)]
    rows = [r for r in rows if not r["id"].startswith("x")] + \
           [dict(r, id=f"x{i}", traj_id=f"x{i}/0") for i, r in enumerate(rows) if r["id"].startswith("x")]
    base = evaluate.score_table(table_of(rows), "token")
    rng = random.Random(0)
    for _ in range(5):
        rng.shuffle(rows)
        assert evaluate.score_table(table_of(rows), "token") == base


def test_missing_optional_columns_give_null_metrics():
    t = pa.table({"id": ["a", "b"], "golden_answers": [["x"], ["y"]], "answer": ["x", "z"]})
    rep = evaluate.score_table(schema.conform(t), "token")
    assert rep["overall"]["f1"] == pytest.approx(0.5)
    assert rep["overall"]["format_error_rate"] is None and rep["overall"]["tokens_per_question"] is None
    assert list(rep["by_source"]) == [evaluate.UNKNOWN_SOURCE]


@pytest.mark.parametrize("change, column", [
    (lambda rows: rows[3].update(golden_answers=["Eiffel Tower", "La tour Eiffel"]), "golden_answers"),
    (lambda rows: rows[3].update(data_source="nq"), "data_source"),
    (lambda rows: rows[1].update(golden_answers=[]), "golden_answers"),
])
def test_inconsistent_rows_are_input_errors(change, column):
    rows = rollout_rows()
    change(rows)
    with pytest.raises(InputError) as e:
        evaluate.score_table(table_of(rows), "token")
    assert e.value.column == column and e.value.row in (1, 3)


def test_same_golden_answers_in_another_order_are_not_a_conflict():
    rows = [_row("q", "nq", ["x", "y"], "x"), _row("q", "nq", ["y", "x"], "y", sample=1)]
    assert evaluate.score_table(table_of(rows), "token")["overall"]["em"] == pytest.approx(1.0)


def test_limit_keeps_every_sample_of_the_first_questions():
    rows = rollout_rows()
    rows.insert(0, rows.pop(3))  # q3's second sample first: q3 is the first question now
    rep = evaluate.run(table_of(rows), evaluate.EvalConfig(limit=2), Context(quiet=True))
    assert (rep["n"], rep["n_trajectories"]) == (2, 3) and set(rep["by_source"]) == {"hotpot", "nq"}


def test_duplicate_question_ids_are_refused_before_rolling_out(monkeypatch):
    monkeypatch.setattr(rollout, "run", lambda *a, **kw: pytest.fail("rollout must not start"))
    t = schema.conform(pa.table({"id": ["a", "a"], "question": ["?", "?"], "golden_answers": [["x"], ["x"]]}))
    with pytest.raises(InputError, match="duplicate question id") as e:
        evaluate.run(t, evaluate.EvalConfig(model="m"), Context(quiet=True))
    assert e.value.row == 1


def test_questions_without_model_are_an_input_error_with_a_hint():
    t = schema.conform(pa.table({"id": ["a"], "question": ["q?"], "golden_answers": [["x"]]}))
    with pytest.raises(InputError) as e:
        evaluate.run(t, evaluate.EvalConfig(), Context(quiet=True))
    assert "--model" in e.value.hint


def test_answers_plus_model_is_refused():
    with pytest.raises(InputError, match="already holds answers"):
        evaluate.run(table_of(rollout_rows()), evaluate.EvalConfig(model="tiny"), Context(quiet=True))


def test_questions_with_model_roll_out_greedy_and_match_by_id(monkeypatch):
    questions = schema.conform(pa.table({
        "id": ["a", "b", "c"], "question": ["qa?", "qb?", "qc?"],
        "golden_answers": [["alpha"], ["beta"], ["gamma"]], "data_source": ["s1", "s1", "s2"]}))
    seen = {}

    def fake_run(table, cfg, ctx, **kw):
        seen["cfg"], seen["ids"] = cfg, table.column("id").to_pylist()
        rows = table.to_pylist()[::-1]  # out of order on purpose: matching must be by id
        # answers keyed by question: a correct, b wrong, (c cut by --limit)
        for r in rows:
            r["answer"] = {"a": "alpha", "b": "delta"}.get(r["id"])
            r["policy"] = cfg.model
        return table_of(rows)

    monkeypatch.setattr(rollout, "run", fake_run)
    cfg = evaluate.EvalConfig(model="tiny-model", search="local:idx", limit=2, max_turns=3, seed=7)
    rep = evaluate.run(questions, cfg, Context(quiet=True))
    rc = seen["cfg"]
    assert (rc.group_size, rc.temperature, rc.model, rc.search, rc.max_turns, rc.seed) == (1, 0.0, "tiny-model", "local:idx", 3, 7)
    assert seen["ids"] == ["a", "b"]
    assert rep["n"] == 2 and rep["overall"]["em"] == pytest.approx(0.5) and rep["model"] == "tiny-model"
    assert rep["kind"] == "questions" and rep["config"]["limit"] == 2


def test_rollout_that_drops_a_question_is_a_runtime_failure(monkeypatch):
    questions = schema.conform(pa.table({"id": ["a", "b"], "question": ["?", "?"], "golden_answers": [["x"], ["y"]]}))
    monkeypatch.setattr(rollout, "run", lambda t, c, ctx, **kw: table_of([_row("a", "s", ["x"], "x")]))
    with pytest.raises(RuntimeError, match="no trajectory"):
        evaluate.run(questions, evaluate.EvalConfig(model="m"), Context(quiet=True))


class FakeJudge:
    """Says correct when a golden answer appears in the prediction line; fails on request."""
    name = "fake"

    def __init__(self):
        self.calls = 0

    def complete(self, prompts):
        self.calls += 1
        if any("BOOM" in p for p in prompts):
            raise ConnectionError("judge server down")
        out = []
        for p in prompts:
            pred = p.split("Prediction: ")[1].split("\n")[0]
            gold = p.split("Golden answers: ")[1].split("\n")[0].split(" | ")
            out.append("???" if "garbage" in pred else
                       ("Correct." if any(g.lower() in pred.lower() for g in gold) else "incorrect"))
        return out


def test_judge_verdicts_and_failures_are_counted_not_scored(monkeypatch):
    judge = FakeJudge()
    monkeypatch.setitem(plugins.JUDGES, "fake", lambda arg, ctx, **kw: judge)
    rows = [_row("a", "s", ["Paris"], "It is Paris"),   # correct
            _row("b", "s", ["Rome"], "Milan"),          # incorrect
            _row("c", "s", ["Oslo"], None),             # no answer: incorrect without a call
            _row("d", "s", ["Bern"], "garbage"),        # unparseable reply: error
            _row("e", "s", ["Kyiv"], "BOOM")]           # failing batch: error
    cfg = evaluate.EvalConfig(judge="fake", judge_batch=1)
    rep = evaluate.run(table_of(rows), cfg, Context(quiet=True))
    ov = rep["overall"]
    assert judge.calls == 4
    assert ov["judge_errors"] == 2 and ov["judge_n"] == 3
    assert ov["judge_accuracy"] == pytest.approx(1 / 3)  # a right, b and c wrong; d, e left out
    assert ov["f1"] == pytest.approx(0.5 / 5)  # F1 ignores the judge: only "It is Paris" scores (P 1/3, R 1)


def test_judge_errors_returned_per_prompt_are_counted(monkeypatch):
    from atomcli.rewards.judges import JudgeError

    class Returns:
        name = "ret"

        def complete(self, prompts):
            return [JudgeError("timeout") if "Rome" in p else "correct" for p in prompts]

    monkeypatch.setitem(plugins.JUDGES, "ret", lambda arg, ctx, **kw: Returns())
    rows = [_row("a", "s", ["Paris"], "Paris"), _row("b", "s", ["Rome"], "Rome")]
    ov = evaluate.run(table_of(rows), evaluate.EvalConfig(judge="ret"), Context(quiet=True))["overall"]
    assert (ov["judge_accuracy"], ov["judge_n"], ov["judge_errors"]) == (1.0, 1, 1)


def test_parse_verdict():
    assert evaluate.parse_verdict("Correct") is True
    assert evaluate.parse_verdict("The prediction is incorrect.") is False
    assert evaluate.parse_verdict("I cannot tell") is None and evaluate.parse_verdict(None) is None


# --- files and CLI --------------------------------------------------------------------------

def _write_jsonl(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def test_run_to_files_writes_json_markdown_and_appends_history(tmp_path):
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    out, md, hist = tmp_path / "rep" / "r.json", tmp_path / "r.md", tmp_path / "h.jsonl"
    for _ in range(2):
        rep = evaluate_io.run_to_files(evaluate, str(src), evaluate.EvalConfig(), Context(quiet=True),
                                       out=str(out), markdown=str(md), history=str(hist))
    data = json.loads(out.read_text())
    assert data["overall"]["f1"] == pytest.approx(0.675) and data["input"] == str(src)
    assert data["model"] == "tiny" and data["n"] == 4 and data["config"]["f1"] == "squad" and data["time"]
    lines = hist.read_text().splitlines()
    assert len(lines) == 2
    rec = json.loads(lines[1])
    assert rec["overall"]["em"] == pytest.approx(0.375) and rec["f1_by_source"]["nq"] == pytest.approx(0.9)
    text = md.read_text()
    assert "| hotpot |" in text and "67.5" in text and "best F1" in text
    assert rep == data


def test_cli_eval_writes_report(tmp_path):
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    proc = atom("eval", src, "--out", tmp_path / "r.json", "--f1", "set", check=True)
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["f1_variant"] == "set" and data["by_source"]["nq"]["n"] == 2
    assert proc.stdout == b"" and b"overall" in proc.stderr  # the table is for people: stderr


def test_cli_eval_report_to_stdout(tmp_path):
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    proc = atom("eval", "-", "--out", "-", input=src.read_bytes(), check=True)
    assert json.loads(proc.stdout)["overall"]["cover_em"] == pytest.approx(0.875)


@pytest.mark.parametrize("lines, needle", [
    (b"", b"empty"),
    (b'{"id": "a", "golden_answers": "Paris", "answer": "Paris"}\n', b"golden_answers"),
    (b'{"id": "a", "golden_answers": ["x"], "answer": "x"}\n{"id": "a", "golden_answers": ["y"], "answer": "y"}\n',
     b"row 1"),
    (b'{"id": "a", "question": "q?", "golden_answers": ["x"]}\n', b"--model"),
    (b'{"id": "a", "answer": "x"}\n', b"golden_answers"),
])
def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, lines, needle):
    src = tmp_path / "in.jsonl"
    src.write_bytes(lines)
    out, hist = tmp_path / "r.json", tmp_path / "h.jsonl"
    proc = atom("eval", src, "--out", out, "--markdown", tmp_path / "r.md", "--history", hist)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.decode().strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_cli_unknown_search_backend_fails_before_any_model_loads(tmp_path):
    src = _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"]}])
    proc = atom("eval", src, "--model", "no-such-model", "--search", "nope", "--out", tmp_path / "r.json")
    assert proc.returncode == 2 and b"unknown search backend" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_cli_unknown_judge_fails_before_reading(tmp_path):
    proc = atom("eval", tmp_path / "does-not-exist.jsonl", "--out", tmp_path / "r.json", "--judge", "nope")
    assert proc.returncode == 2 and b"unknown judge" in proc.stderr and b"not found" not in proc.stderr


def test_eval_questions_with_a_real_rollout(tmp_path, tiny_model):
    """The questions + --model path end to end (in-process): tiny random policy, local index."""
    from atomcli.env import search_local
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": "d1", "title": "Paris", "contents": "Paris is the capital of France."},
        {"id": "d2", "title": "Rome", "contents": "Rome is the capital of Italy."}])
    search_local.build_index(str(corpus), str(tmp_path / "index.sqlite"), context=Context(quiet=True))
    questions = _write_jsonl(tmp_path / "q.jsonl", [
        {"id": "b", "question": "Capital of Italy?", "golden_answers": ["Rome"], "data_source": "toy"},
        {"id": "a", "question": "Capital of France?", "golden_answers": ["Paris"], "data_source": "toy"}])
    cfg = evaluate.EvalConfig(model=str(tiny_model), search=f"local:{tmp_path / 'index.sqlite'}",
                              max_turns=2, max_new_tokens=8)
    out, answers = tmp_path / "r.json", tmp_path / "answers.parquet"
    evaluate_io.run_to_files(evaluate, str(questions), cfg, Context(quiet=True), out=str(out), answers=str(answers))
    rep = json.loads(out.read_text())
    assert rep["kind"] == "questions" and rep["n"] == 2 and rep["n_trajectories"] == 2
    assert rep["model"] == str(tiny_model) and list(rep["by_source"]) == ["toy"]
    assert 0.0 <= rep["overall"]["f1"] <= 1.0 and 1 <= rep["overall"]["mean_turns"] <= 2
    # --answers: the transcripts behind the report; scoring them again gives the same numbers
    from atomcli import tableio
    table = tableio.read_table(str(answers))
    assert sorted(table.column("id").to_pylist()) == ["a", "b"]
    assert {"messages", "finish_reason", "answer", "completion_ids"} <= set(table.column_names)
    again = evaluate_io.run_to_files(evaluate, str(answers), evaluate.EvalConfig(), Context(quiet=True),
                                     out=str(tmp_path / "again.json"))
    assert again["overall"]["f1"] == rep["overall"]["f1"] and again["per_question"] == rep["per_question"]


def test_cli_answers_needs_questions_and_a_model(tmp_path):
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "question": "q?", "golden_answers": ["x"], "answer": "x"}])
    proc = atom("eval", src, "--out", tmp_path / "r.json", "--answers", tmp_path / "a.parquet")
    assert proc.returncode == 2 and b"--answers" in proc.stderr
    assert len(proc.stderr.decode().strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_eval_rollout_settings_come_from_the_rollout_section_and_a_fixed_date():
    cfg = evaluate.EvalConfig(model="m", rollout={"k": 3, "max_turns": 4, "batch_size": 7, "temperature": 0.7})
    r = evaluate.rollout_config(cfg)
    assert (r.k, r.max_turns, r.batch_size, r.group_size, r.temperature) == (3, 4, 7, 1, 0.0)
    assert r.date == evaluate.FIXED_DATE and r.model == "m" and r.search == "ddg"
    r = evaluate.rollout_config(evaluate.EvalConfig(model="m", max_turns=2, search="local:x", greedy=False,
                                                    rollout={"date": "2025-05-05", "temperature": 0.7}))
    assert (r.max_turns, r.search, r.date, r.temperature) == (2, "local:x", "2025-05-05", 0.7)
    with pytest.raises(InputError, match="unknown option"):
        evaluate.rollout_config(evaluate.EvalConfig(model="m", rollout={"group": 3}))


def test_eval_can_answer_at_the_cap_when_the_training_rollouts_do_not():
    # the learn preset: [rollout] without the rule (training), [eval] with it (every eval of the run)
    plain = evaluate.rollout_config(evaluate.EvalConfig(model="m", rollout={"max_turns": 4}))
    assert (plain.last_turn_note, plain.force_answer) == (False, False)
    r = evaluate.rollout_config(evaluate.EvalConfig(model="m", force_answer=True, last_turn_note=True,
                                                    rollout={"max_turns": 4}))
    assert (r.last_turn_note, r.force_answer, r.max_turns) == (True, True, 4)
    # the [rollout] section's rule stays on when [eval] does not set it
    r = evaluate.rollout_config(evaluate.EvalConfig(model="m", rollout={"force_answer": True}))
    assert (r.last_turn_note, r.force_answer) == (False, True)


def test_two_evals_on_different_days_give_the_same_report(tmp_path, tiny_model, monkeypatch):
    import datetime as dt

    from atomcli.agent import format as agent_format
    from atomcli.env import search_local
    corpus = _write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": "d1", "title": "Paris", "contents": "Paris is the capital of France."}])
    search_local.build_index(str(corpus), str(tmp_path / "index.sqlite"), context=Context(quiet=True))
    questions = _write_jsonl(tmp_path / "q.jsonl", [
        {"id": "a", "question": "Capital of France?", "golden_answers": ["Paris"], "data_source": "toy"}])
    cfg = evaluate.EvalConfig(model=str(tiny_model), search=f"local:{tmp_path / 'index.sqlite'}",
                              max_turns=2, max_new_tokens=8)
    reports = []
    for day in (dt.date(2026, 3, 1), dt.date(2027, 9, 9)):
        class Day(dt.date):
            @classmethod
            def today(cls, d=day):
                return d
        monkeypatch.setattr(agent_format._dt, "date", Day)
        rep = evaluate.run(tableio.read_table(str(questions)), cfg, Context(quiet=True))
        reports.append({k: v for k, v in rep.items() if k != "time"})
    assert reports[0] == reports[1] and reports[0]["rollout"]["date"] == evaluate.FIXED_DATE
    # the control: with the date left to the clock, the prompt (and so the rollout) would differ by day
    assert agent_format.system_prompt("") != agent_format.system_prompt("2026-01-01")


# --- data text printed to a terminal ------------------------------------------------------------------

HOSTILE = "nq\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J\u202e[red]x[/red]"


def test_a_hostile_data_source_reaches_no_terminal_raw(tmp_path):
    rows = rollout_rows()
    for r in rows:
        r["data_source"] = HOSTILE
    src = _write_jsonl(tmp_path / "r.jsonl", rows)
    proc = atom("eval", src, "--out", tmp_path / "r.json", "--markdown", "-", check=True, env={"COLUMNS": "300"})
    for stream in (proc.stdout, proc.stderr):
        assert b"\x1b" not in stream and b"\x07" not in stream and "\u202e".encode() not in stream
    assert b"\\x1b]52" in proc.stdout and b"\\x1b]52" in proc.stderr  # shown as escapes, not dropped
    assert b"[red]x[/red]" in proc.stderr  # data is never rich markup
    # the JSON report keeps the data as it is
    assert HOSTILE in json.loads((tmp_path / "r.json").read_text())["by_source"]


# --- the history: what each line records, a settings change, the series, the lock --------------------

def _eval(src, tmp_path, *args, name="r.json"):
    return atom("eval", src, "--out", tmp_path / name, "--history", tmp_path / "h.jsonl", *args)


def test_history_lines_record_checkpoint_version_settings_and_say_when_settings_change(tmp_path):
    from atomcli import __version__
    from atomcli.stages import eval_history
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    first = _eval(src, tmp_path)
    same = _eval(src, tmp_path)
    other = _eval(src, tmp_path, "--f1", "set", "--markdown", tmp_path / "r.md")
    assert first.returncode == same.returncode == other.returncode == 0, other.stderr
    lines = eval_history.read(tmp_path / "h.jsonl")
    assert [x["version"] for x in lines] == [__version__] * 3 and lines[0]["checkpoint"] == "tiny"
    assert lines[0]["settings_digest"] == lines[1]["settings_digest"] != lines[2]["settings_digest"]
    assert set(lines[0]["per_question"]) == {"q1", "q2", "q3", "q4"} and lines[0]["settings"]["f1_variant"] == "squad"
    assert b"settings differ" not in same.stderr and b"settings differ" in other.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["history"]["settings_changed"] == ['f1_variant: "squad" -> "set"']
    assert "settings differ from the previous line" in (tmp_path / "r.md").read_text()


def test_rolled_out_settings_that_move_the_number_are_in_the_digest():
    from atomcli.stages import eval_history
    report = evaluate.score_table(table_of(rollout_rows()))
    report.update(kind="questions", config={"judge": ""}, rollout={"model": "a", "k": 3, "max_turns": 4,
                                                                   "concurrency": 8})
    base = eval_history.record(report)
    moved = eval_history.record({**report, "rollout": {**report["rollout"], "k": 10}})
    paced = eval_history.record({**report, "model": "b", "rollout": {**report["rollout"], "model": "b",
                                                                     "concurrency": 2}})
    assert eval_history.changes(base, moved) == ["[rollout] k: 3 -> 10"]
    assert eval_history.changes(base, paced) == [] and paced["checkpoint"] == "b"
    # other questions under the same ids are another measurement
    rows = rollout_rows()
    rows[0]["question"] = "another question?"
    edited = eval_history.record({**report, **evaluate.score_table(table_of(rows))})
    assert [c.split(":")[0] for c in eval_history.changes(base, edited)] == ["questions"]


def test_history_series_table_plot_and_paired_intervals(tmp_path):
    from atomcli.stages import eval_history
    rows = rollout_rows()
    src = _write_jsonl(tmp_path / "a.jsonl", rows)
    better = [dict(r, answer=r["golden_answers"][0]) for r in rows]
    src2 = _write_jsonl(tmp_path / "b.jsonl", better)
    for s, extra in ((src, ()), (src2, ()), (src2, ("--f1", "set")), (src, ("--f1", "set"))):
        assert _eval(s, tmp_path, *extra).returncode == 0
    proc = atom("eval", "--history", tmp_path / "h.jsonl", "--plot", tmp_path / "h.png", "--out", tmp_path / "s.json",
                "--markdown", tmp_path / "s.md", check=True)
    points = json.loads((tmp_path / "s.json").read_text())["points"]
    assert [p["vs_line"] for p in points] == [None, 1, None, 3]  # a settings change starts a new curve
    assert points[1]["delta_f1"]["diff"] == pytest.approx(1 - 0.675) and points[1]["paired"] == 4
    assert points[1]["delta_f1"]["low"] <= points[1]["delta_f1"]["diff"] <= points[1]["delta_f1"]["high"]
    assert points[2]["settings_changed"] and not points[3]["settings_changed"]
    assert points[3]["delta_f1"]["diff"] < 0
    assert (tmp_path / "h.png").read_bytes()[:4] == b"\x89PNG" and b"CHANGED" in proc.stderr
    assert "**CHANGED: f1_variant**" in (tmp_path / "s.md").read_text()
    previous = eval_history.series(eval_history.read(tmp_path / "h.jsonl"), "previous")
    assert [p["vs_line"] for p in previous] == [None, 1, None, 3]
    # without --history or input there is nothing to do: one line, exit 2
    proc = atom("eval", "--out", tmp_path / "x.json")
    assert proc.returncode == 2 and b"nothing to evaluate" in proc.stderr


def test_old_history_lines_without_settings_are_shown_not_joined(tmp_path):
    from atomcli.stages import eval_history
    old = {"time": "2026-01-01T00:00:00+00:00", "model": "m", "n": 4, "overall": {"f1": 0.5, "em": 0.25}}
    hist = tmp_path / "h.jsonl"
    hist.write_text(json.dumps(old) + "\n")
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    proc = _eval(src, tmp_path)
    assert proc.returncode == 0 and b"settings differ" in proc.stderr
    points = eval_history.series(eval_history.read(hist))
    assert points[1]["settings_changed"] == [eval_history.NOT_RECORDED] and points[1]["delta_f1"] is None
    hist.write_text(hist.read_text() + "not json\n")
    proc = atom("eval", "--history", hist)
    assert proc.returncode == 2 and b"line 3 is not JSON" in proc.stderr


def test_an_overlapping_eval_waits_for_the_lock_then_refuses_with_one_line(tmp_path):
    from atomcli.stages import eval_history
    src = _write_jsonl(tmp_path / "r.jsonl", rollout_rows())
    hist = tmp_path / "h.jsonl"
    with eval_history.locked(hist, 0):  # another eval is still running
        proc = _eval(src, tmp_path, "--wait", "0", "--markdown", tmp_path / "r.md")
        err = proc.stderr.decode()
        assert proc.returncode == 2 and "another `atom eval` (pid" in err and "still writing" in err, err
        assert len(err.strip().splitlines()) == 1
        assert not hist.exists() and not (tmp_path / "r.json").exists() and not (tmp_path / "r.md").exists()
    # the holder lets go only once the second eval has said that it waits: then its line comes after the holder's
    import subprocess
    import sys
    with eval_history.locked(hist, 0):
        proc = subprocess.Popen([sys.executable, "-m", "atomcli", "eval", src, "--out", tmp_path / "r.json",
                                 "--history", hist, "--wait", "120"], stderr=subprocess.PIPE)
        said = b""
        while b"waiting" not in said and proc.poll() is None:
            said += proc.stderr.read1(4096)
        eval_history.append(hist, {"overall": {}, "time": "first"})
    _, rest = proc.communicate(timeout=300)
    assert proc.returncode == 0 and b"waiting" in said, said + rest
    lines = eval_history.read(hist)
    assert [x["time"] for x in lines][0] == "first" and len(lines) == 2
    assert json.loads((tmp_path / "r.json").read_text())["history"]["previous"]["time"] == "first"
