"""Outcome metrics against hand-computed values, and properties that hold for any input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomcli import metrics

# (prediction, golden answers, token F1, EM, cover-EM), each worked out by hand
CASES = [
    ("The Eiffel Tower", ["eiffel tower"], 1.0, 1.0, 1.0),               # article and case dropped
    ("an apple a day", ["apple day"], 1.0, 1.0, 1.0),                   # every article dropped
    ("Paris, France.", ["Paris"], 2 / 3, 0.0, 1.0),                     # P 1/2, R 1
    ("New York City", ["NYC", "New York"], 0.8, 0.0, 1.0),              # best gold: P 2/3, R 1
    ("cat cat", ["the cat"], 2 / 3, 0.0, 1.0),                          # bag of tokens: 1 common of 2
    ("1,000-year war", ["1000 year war"], 4 / 7, 0.0, 0.0),             # "1 000 year war": 2 common, P 1/2, R 2/3
    ("“Hamlet”", ["Hamlet"], 1.0, 1.0, 1.0),                            # curly quotes are punctuation
    ("ＰＡＲＩＳ", ["paris"], 1.0, 1.0, 1.0),                           # full-width folds under NFKC
    ("Zürich", ["Zurich"], 0.0, 0.0, 0.0),                              # accents are kept: different word
    ("Zürich", ["zürich"], 1.0, 1.0, 1.0),
    ("", ["Paris"], 0.0, 0.0, 0.0),                                     # empty prediction
    (None, ["Paris"], 0.0, 0.0, 0.0),                                   # no answer at all
    ("Paris", [], 0.0, 0.0, 0.0),                                       # no gold
    ("Paris", ["", None, "paris"], 1.0, 1.0, 1.0),                      # empty / null golds skipped
    ("the", ["the"], 0.0, 0.0, 0.0),                                    # normalizes to nothing: no credit
    ("Barack Obama", ["Obama"], 2 / 3, 0.0, 1.0),
    ("Obama", ["Barack Obama"], 2 / 3, 0.0, 0.0),                       # P 1, R 1/2
    ("yes", ["Yes."], 1.0, 1.0, 1.0),
    ("Paris Texas", "Paris", 2 / 3, 0.0, 1.0),                          # a bare string gold works too
    ("New  York\n", ["new york"], 1.0, 1.0, 1.0),                       # whitespace collapsed
]


@pytest.mark.parametrize("pred, golds, f1, em, cover", CASES)
def test_metrics_match_hand_computed_values(pred, golds, f1, em, cover):
    assert metrics.f1(pred, golds) == pytest.approx(f1)
    assert metrics.em(pred, golds) == em
    assert metrics.cover_em(pred, golds) == cover


@pytest.mark.parametrize("pred, golds, want", [
    ("cat cat", ["cat"], 1.0),                 # sets: {cat} vs {cat}
    ("the cat", ["cat"], 2 / 3),               # articles kept: {the, cat} vs {cat}
    ("The Eiffel Tower", ["eiffel tower"], 0.8),  # P 2/3, R 1
    ("", ["x"], 0.0),
])
def test_set_f1_is_deepresearchers_variant(pred, golds, want):
    assert metrics.f1(pred, golds, variant="set") == pytest.approx(want)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError):
        metrics.f1("a", ["a"], variant="bag")


def test_normalize():
    assert metrics.normalize("  The QUICK, brown-fox!  ") == "quick brown fox"
    assert metrics.normalize("The fox", keep_articles=True) == "the fox"
    assert metrics.normalize(None) == ""


anything = st.none() | st.text(max_size=30) | st.text(alphabet="ab the,.!\u00e9\uff21 ", max_size=20)
golds = st.none() | st.text(max_size=20) | st.lists(st.none() | st.text(max_size=20), max_size=4)


@settings(max_examples=400, deadline=None)
@given(pred=anything, gold=golds)
def test_metrics_are_total_and_bounded(pred, gold):
    f1, em, cover = metrics.f1(pred, gold), metrics.em(pred, gold), metrics.cover_em(pred, gold)
    sf1 = metrics.f1(pred, gold, variant="set")
    for v in (f1, em, cover, sf1):
        assert isinstance(v, float) and 0.0 <= v <= 1.0
    assert em in (0.0, 1.0) and cover in (0.0, 1.0)
    if em == 1.0:  # an exact match is also a full token F1 and is covered
        assert f1 == pytest.approx(1.0) and cover == 1.0


@settings(max_examples=200, deadline=None)
@given(a=st.text(max_size=30), b=st.text(max_size=30))
def test_token_f1_is_symmetric_and_self_match_is_full(a, b):
    assert metrics.token_f1(a, b) == pytest.approx(metrics.token_f1(b, a))
    if metrics.normalize(a):
        assert metrics.f1(a, [a]) == pytest.approx(1.0) and metrics.em(a, [a]) == 1.0
    assert metrics.normalize(metrics.normalize(a)) == metrics.normalize(a)  # idempotent
