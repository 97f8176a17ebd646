"""Paired comparison (`eval --compare`): the difference and its bootstrap interval against hand math."""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import atom

from atomcli.errors import InputError
from atomcli.stages import compare


def test_paired_difference_and_interval_cover_hand_computed_values():
    new = {f"q{i}": 1.0 if i < 30 else 0.0 for i in range(100)}
    base = {f"q{i}": 1.0 if i < 10 else 0.0 for i in range(100)}
    c = compare.paired(new, base, n_boot=4000, seed=1)
    assert c["n"] == 100 and c["diff"] == pytest.approx(0.2)
    assert c["new"] == pytest.approx(0.3) and c["base"] == pytest.approx(0.1)
    # 20 of 100 paired differences are +1, the rest 0: the mean's standard error is sqrt(.2*.8/100) = .04,
    # so the 95% interval is about 0.2 ± 0.08
    assert 0.10 < c["low"] < 0.14 and 0.26 < c["high"] < 0.30
    assert c["p_le_0"] == 0.0
    assert compare.paired(new, base, n_boot=4000, seed=1) == c  # seeded: repeatable


def test_pairing_is_by_id_not_order():
    rng = random.Random(0)
    base = {f"q{i}": rng.random() for i in range(50)}
    new = {k: v + 0.1 for k, v in reversed(list(base.items()))}
    c = compare.paired(new, base, n_boot=500)
    # every paired difference is exactly +0.1: the interval collapses on it
    assert c["diff"] == pytest.approx(0.1) and c["low"] == pytest.approx(0.1) and c["high"] == pytest.approx(0.1)


def test_no_difference_gives_an_interval_around_zero():
    rng = random.Random(3)
    base = {f"q{i}": float(rng.random() < 0.3) for i in range(200)}
    new = {k: float(rng.random() < 0.3) for k in base}  # independent draws of the same rate
    c = compare.paired(new, base)
    assert c["low"] < 0 < c["high"] or math.isclose(c["diff"], 0)


def _report(per_question, variant="squad"):
    return {"f1_variant": variant, "per_question": per_question}


def test_compare_reports_per_source_and_refusals():
    pq_new = {"a": {"source": "s1", "f1": 1.0, "em": 1.0}, "b": {"source": "s2", "f1": 0.5, "em": 0.0},
              "c": {"source": "s2", "f1": 0.0, "em": 0.0}}
    pq_base = {"a": {"source": "s1", "f1": 0.0, "em": 0.0}, "b": {"source": "s2", "f1": 0.5, "em": 0.0},
               "z": {"source": "s2", "f1": 1.0, "em": 1.0}}
    c = compare.compare_reports(_report(pq_new), _report(pq_base), baseline_name="base.json", n_boot=200)
    assert c["n_shared"] == 2 and c["only_new"] == 1 and c["only_baseline"] == 1
    assert c["overall"]["f1"]["diff"] == pytest.approx(0.5)
    assert c["by_source"]["s1"]["f1"]["diff"] == pytest.approx(1.0)
    assert c["by_source"]["s2"]["em"]["diff"] == pytest.approx(0.0)
    with pytest.raises(InputError, match="no question id in common"):
        compare.compare_reports(_report(pq_new), _report({"x": pq_base["z"]}))
    with pytest.raises(InputError, match="scored with F1"):
        compare.compare_reports(_report(pq_new), _report(pq_base, "set"))
    with pytest.raises(InputError, match="per-question"):
        compare.compare_reports(_report(pq_new), {"overall": {}})


def _answered(path, answers):
    rows = [{"id": f"q{i}", "question": f"q{i}?", "golden_answers": [g], "data_source": "demo",
             "answer": a} for i, (g, a) in enumerate(answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_cli_eval_compare_with_a_table_and_with_a_report(tmp_path):
    golds = [f"answer {i}" for i in range(40)]
    base = _answered(tmp_path / "base.jsonl", [(g, g if i < 8 else "no") for i, g in enumerate(golds)])
    new = _answered(tmp_path / "new.jsonl", [(g, g if i < 24 else "no") for i, g in enumerate(golds)])
    atom("eval", base, "--out", tmp_path / "base.json", check=True)
    for baseline in (base, tmp_path / "base.json"):
        proc = atom("eval", new, "--out", tmp_path / "new.json", "--compare", baseline,
                    "--markdown", tmp_path / "new.md", check=True)
        rep = json.loads((tmp_path / "new.json").read_text())
        c = rep["compare"]["overall"]["em"]
        assert c["diff"] == pytest.approx(0.4) and c["low"] > 0.2 and c["n"] == 40
        assert b"paired bootstrap" in proc.stderr and "Against" in (tmp_path / "new.md").read_text()
    bad = atom("eval", new, "--out", tmp_path / "x.json", "--compare", tmp_path / "missing.json")
    assert bad.returncode == 2 and not (tmp_path / "x.json").exists()


def _pq(source="s", question="qa", golds="ga", f1=1.0, em=1.0):
    return {"source": source, "question_digest": question, "golds_digest": golds, "f1": f1, "em": em}


def test_same_ids_that_name_other_questions_are_never_paired():
    new = {f"test_{i}": _pq(question=f"mine {i}") for i in range(4)}
    other = {f"test_{i}": _pq(question=f"theirs {i}", f1=0.0, em=0.0) for i in range(4)}
    with pytest.raises(InputError, match=r"none is the same question \(id `test_0`: the question text differs"):
        compare.compare_reports(_report(new), _report(other), baseline_name="other.json", n_boot=50)
    # a baseline that records no question text (an older report): the data_source still tells them apart
    old = {f"test_{i}": {"source": "nq", "f1": 0.0, "em": 0.0} for i in range(4)}
    with pytest.raises(InputError, match="data_source differs"):
        compare.compare_reports(_report(new), _report(old), n_boot=50)
    # one edited question among three: left out and counted, the rest paired
    base = {"a": _pq(f1=0.0), "b": _pq(question="qb", f1=0.0), "c": _pq(question="qc", golds="other", f1=0.0)}
    mine = {"a": _pq(), "b": _pq(question="qb"), "c": _pq(question="qc")}
    c = compare.compare_reports(_report(mine), _report(base), n_boot=50)
    assert c["n_shared"] == 2 and c["mismatched"] == 1 and c["mismatched_ids"] == ["c"]
    assert c["paired_on"] == ["id", "question text", "golden answers", "data_source"]
    assert c["overall"]["f1"]["diff"] == pytest.approx(1.0)


@pytest.mark.parametrize("value, shown", [(None, "null"), ("0.5", "'0.5'"), (True, "True"), ([1], "[1]")])
def test_a_bad_score_in_a_baseline_names_the_file_and_question(value, shown):
    base = {"a": _pq(), "b": _pq(f1=value)}
    with pytest.raises(InputError) as e:
        compare.compare_reports(_report({"a": _pq(), "b": _pq()}), _report(base), baseline_name="base.json")
    assert e.value.one_line().startswith("base.json") and f"question `b` has `f1` {shown}, not a number" in str(e.value)


def test_cli_compare_refuses_another_benchmark_and_bad_values_with_one_line(tmp_path):
    golds = [f"answer {i}" for i in range(4)]
    mine = _answered(tmp_path / "mine.jsonl", [(g, g) for g in golds])
    # another benchmark whose ids happen to match: other questions, other golds, another data_source
    rows = [{"id": f"q{i}", "question": f"other {i}?", "golden_answers": ["zzz"], "data_source": "other",
             "answer": "no"} for i in range(4)]
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = atom("eval", mine, "--out", tmp_path / "r.json", "--compare", other)
    assert proc.returncode == 2 and b"none is the same question" in proc.stderr, proc.stderr
    assert len(proc.stderr.decode().strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()
    atom("eval", mine, "--out", tmp_path / "base.json", check=True)
    report = json.loads((tmp_path / "base.json").read_text())
    report["per_question"]["q2"]["f1"] = None
    (tmp_path / "base.json").write_text(json.dumps(report))
    proc = atom("eval", mine, "--out", tmp_path / "r.json", "--compare", tmp_path / "base.json")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "base.json" in err and "question `q2` has `f1` null" in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and not (tmp_path / "r.json").exists()


def test_a_baseline_of_other_questions_is_refused_before_any_rollout(tmp_path, monkeypatch):
    from atomcli.context import Context
    from atomcli.stages import evaluate, evaluate_io
    rows = [{"id": f"q{i}", "question": f"mine {i}?", "golden_answers": [f"a{i}"]} for i in range(3)]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    other = _answered(tmp_path / "other.jsonl", [("x", "x")] * 3)  # q0..q2, other texts
    monkeypatch.setattr(evaluate, "_roll_out", lambda *a: pytest.fail("rolled out before checking the baseline"))
    cfg = evaluate.EvalConfig(model="m", search="local:nowhere")
    monkeypatch.setattr(evaluate_io.plugins, "check_search_spec", lambda spec: None)
    with pytest.raises(InputError, match="none is the same question"):
        evaluate_io.run_to_files(evaluate, str(questions), cfg, Context(quiet=True), out=str(tmp_path / "r.json"),
                                 compare=str(other))
    # the identities checked before the rollout are the ones the report records after it
    scored = evaluate.score_table(tableio_read(other))["per_question"]
    assert evaluate.identities(tableio_read(other)) == {
        q: {k: v[k] for k in (compare.SOURCE, compare.QUESTION, compare.GOLDS)} for q, v in scored.items()}


def tableio_read(path):
    from atomcli import tableio
    return tableio.read_table(str(path))
