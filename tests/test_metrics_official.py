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
