"""atomcli.rewards.metrics reproduces the official scorers on every case of tests/data/metric_cases.jsonl.

The expected values were computed by running the official scripts (SQuAD v1.1, HotpotQA, FlashRAG,
DeepResearcher; versions in tests/data/README.md), so a change here is a change of reward.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atomcli.rewards import metrics

CASES = [json.loads(line) for line in
         (Path(__file__).parent / "data" / "metric_cases.jsonl").read_text(encoding="utf-8").split("\n") if line.strip()]

# expected field -> our function
SCORED = {
    "squad_f1": lambda p, g: metrics.f1(p, g, "squad"),
    "token_f1": lambda p, g: metrics.f1(p, g, "token"),  # alias: expected = squad_f1
    "squad_em": metrics.em,
    "hotpot_f1": lambda p, g: metrics.f1(p, g, "hotpot"),
    "flashrag_sub_em": metrics.cover_em,
    "deepresearcher_f1": lambda p, g: metrics.f1(p, g, "set"),
}


def test_the_table_is_big_and_covers_every_category():
    assert len(CASES) >= 300
    cats = {c["category"].split(":")[0] for c in CASES}
    assert {"normal", "punctuation", "articles", "unicode-letters", "unicode-punctuation", "numbers-dates",
            "yes-no", "empty", "several-golds"} <= cats


@pytest.mark.parametrize("field", list(SCORED))
def test_every_case_matches_the_official_value(field):
    want_field = "squad_f1" if field == "token_f1" else field
    wrong = []
    for c in CASES:
        got = SCORED[field](c["prediction"], c["golden_answers"])
        want = c[want_field]
        if not (isinstance(got, float) and got == pytest.approx(want, abs=1e-12, rel=0)):
            wrong.append((c["id"], c["prediction"], c["golden_answers"], got, want))
    assert not wrong, f"{len(wrong)} of {len(CASES)} cases differ from the official {want_field}: {wrong[:10]}"


@pytest.mark.parametrize("pred, golds, squad, hotpot, dr", [
    ("3.7", ["3.9"], 0.0, 0.0, 0.5),                 # punctuation deleted: "37" vs "39"; DeepResearcher: {3,7} vs {3,9}
    ("1970-07-20", ["1969-07-20"], 0.0, 0.0, 2 / 3),
    ("U.S.", ["US"], 1.0, 1.0, 0.0),                 # "us" == "us"; DeepResearcher: {u, s} vs {us}
    ("yes, it is", ["yes"], 0.5, 0.0, 0.5),          # HotpotQA: a yes/no gold needs a yes/no answer
    ("“Hamlet”", ["Hamlet"], 0.0, 0.0, 0.0),         # curly quotes are not punctuation to any official scorer
])
def test_headline_cases(pred, golds, squad, hotpot, dr):
    assert metrics.f1(pred, golds) == pytest.approx(squad)
    assert metrics.f1(pred, golds, "hotpot") == pytest.approx(hotpot)
    assert metrics.f1(pred, golds, "set") == pytest.approx(dr)


def test_scorer_names():
    assert metrics.f1_scorer("token") == "squad" and metrics.f1_scorer("set") == "set"
    assert metrics.scorers("token") == {"f1": "squad", "em": "squad", "cover_em": "flashrag-sub-em"}
    assert set(metrics.F1_VARIANTS) - set(metrics.F1_ALIASES) <= set(metrics.SCORERS)
    with pytest.raises(ValueError, match="squad, hotpot, set, token"):
        metrics.f1_scorer("bag")


# --- end to end: what `atom eval` reports and `aggregate-reward` pays --------------------------------

@pytest.mark.parametrize("variant, field", [("squad", "squad_f1"), ("hotpot", "hotpot_f1"), ("set", "deepresearcher_f1")])
def test_atom_eval_and_aggregate_reward_reproduce_the_official_scores(tmp_path, variant, field):
    import json as _json

    from conftest import atom

    from atomcli import tableio
    # eval leaves blank golden answers out (a blank gold would cover-EM any answer, and it refuses a row with no
    # other): cases with one are unit-tested above, at the metric level
    cases = [c for c in CASES if c["golden_answers"] and all(g is not None and str(g).strip() for g in c["golden_answers"])]
    rows = [{"id": f"c{c['id']}", "question": "q?", "golden_answers": [g for g in c["golden_answers"] if g is not None],
             "data_source": c["category"], "answer": c["prediction"], "group_id": f"c{c['id']}",
             "messages": [{"role": "assistant", "content": "<think>x</think><answer>a</answer>"}], "format_ok": True}
            for c in cases]
    src = tmp_path / "answered.jsonl"
    src.write_text("".join(_json.dumps(r) + "\n" for r in rows))
    atom("eval", src, "--f1", variant, "--out", tmp_path / "r.json", check=True)
    rep = _json.loads((tmp_path / "r.json").read_text())
    assert rep["scorers"]["f1"] == variant and len(rep["per_question"]) == len(cases) > 250
    for c in cases:
        got = rep["per_question"][f"c{c['id']}"]
        assert (got["f1"], got["em"], got["cover_em"]) == (c[field], c["squad_em"], c["flashrag_sub_em"]), c
    atom("aggregate-reward", src, "--f1", variant, "--process", "none", "--step", "0", "--total-steps", "1",
         "--out", tmp_path / "w.parquet", check=True)
    paid = {r["id"]: r for r in tableio.read_table(str(tmp_path / "w.parquet")).to_pylist()}
    for c in cases:
        r = paid[f"c{c['id']}"]
        assert r["f1"] == c[field] and r["reward"] == c[field] and r["em"] == c["squad_em"]
