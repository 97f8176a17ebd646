"""Outcome metrics against hand-computed values, and properties that hold for any input.

The values follow the official scorers (SQuAD v1.1 normalization: ASCII punctuation deleted, no
Unicode folding); tests/test_metrics_official.py checks several hundred cases against them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomcli.rewards import metrics

# (prediction, golden answers, SQuAD F1, EM, cover-EM = FlashRAG sub-EM), each worked out by hand
CASES = [
    ("The Eiffel Tower", ["eiffel tower"], 1.0, 1.0, 1.0),               # article and case dropped
    ("an apple a day", ["apple day"], 1.0, 1.0, 1.0),                   # every article dropped
    ("Paris, France.", ["Paris"], 2 / 3, 0.0, 1.0),                     # P 1/2, R 1
    ("New York City", ["NYC", "New York"], 0.8, 0.0, 1.0),              # best gold: P 2/3, R 1
    ("cat cat", ["the cat"], 2 / 3, 0.0, 1.0),                          # bag of tokens: 1 common of 2
    ("1,000-year war", ["1000 year war"], 0.4, 0.0, 0.0),               # punctuation deleted: "1000year war",
                                                                        # 1 common ("war"), P 1/2, R 1/3
    ("“Hamlet”", ["Hamlet"], 0.0, 0.0, 1.0),                            # curly quotes are not ASCII punctuation:
                                                                        # token "“hamlet”", but "hamlet" is a substring
    ("ＰＡＲＩＳ", ["paris"], 0.0, 0.0, 0.0),                           # no NFKC: full-width letters stay different
    ("Zürich", ["Zurich"], 0.0, 0.0, 0.0),                              # accents are kept: different word
    ("Zürich", ["zürich"], 1.0, 1.0, 1.0),
    ("", ["Paris"], 0.0, 0.0, 0.0),                                     # empty prediction
    (None, ["Paris"], 0.0, 0.0, 0.0),                                   # no answer at all
    ("Paris", [], 0.0, 0.0, 0.0),                                       # no gold
    ("Paris", ["", None, "paris"], 1.0, 1.0, 1.0),                      # empty / null golds skipped
    ("the", ["the"], 0.0, 1.0, 1.0),                                    # both normalize to "": SQuAD EM 1 (F1 0),
                                                                        # and "" is a substring of anything
    ("Stuttgart", ["art"], 0.0, 0.0, 1.0),                              # sub-EM is a substring test, not whole words
    ("U.S.", ["US"], 1.0, 1.0, 1.0),                                    # "us" == "us"
    ("3.7", ["3.9"], 0.0, 0.0, 0.0),                                    # "37" vs "39"
    ("Barack Obama", ["Obama"], 2 / 3, 0.0, 1.0),
    ("Obama", ["Barack Obama"], 2 / 3, 0.0, 0.0),                       # P 1, R 1/2
    ("yes", ["Yes."], 1.0, 1.0, 1.0),
    ("Paris Texas", "Paris", 2 / 3, 0.0, 1.0),                          # a bare string gold works too
    ("New  York\n", ["new york"], 1.0, 1.0, 1.0),                       # whitespace collapsed
]


CASES_FOR_ALIAS = [(p, g) for p, g, *_ in CASES]


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
    ("“Paris”", ["paris"], 0.0),               # DeepResearcher only replaces ASCII punctuation
    ("3.7", ["3.9"], 0.5),                     # {3, 7} vs {3, 9}: punctuation becomes a space
])
def test_set_f1_is_deepresearchers_variant(pred, golds, want):
    assert metrics.f1(pred, golds, variant="set") == pytest.approx(want)


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError):
        metrics.f1("a", ["a"], variant="bag")


def test_normalize():
    assert metrics.normalize("  The QUICK, brown-fox!  ") == "quick brownfox"  # punctuation deleted, not spaced
    assert metrics.normalize("“Zürich”") == "“zürich”"                         # no Unicode punctuation or folding
    assert metrics.normalize(None) == ""
    assert metrics.set_tokens("The fox, too") == {"the", "fox", "too"}         # DeepResearcher keeps articles
    assert metrics.set_tokens(None) == set()


def test_token_is_an_alias_of_squad():
    for pred, golds in CASES_FOR_ALIAS:
        assert metrics.f1(pred, golds, "token") == metrics.f1(pred, golds, "squad") == metrics.f1(pred, golds)


anything = st.none() | st.text(max_size=30) | st.text(alphabet="ab the,.!\u00e9\uff21 ", max_size=20)
golds = st.none() | st.text(max_size=20) | st.lists(st.none() | st.text(max_size=20), max_size=4)


@settings(max_examples=400, deadline=None)
@given(pred=anything, gold=golds)
def test_metrics_are_total_and_bounded(pred, gold):
    f1, em, cover = metrics.f1(pred, gold), metrics.em(pred, gold), metrics.cover_em(pred, gold)
    sf1, hf1 = metrics.f1(pred, gold, variant="set"), metrics.f1(pred, gold, variant="hotpot")
    for v in (f1, em, cover, sf1, hf1):
        assert isinstance(v, float) and 0.0 <= v <= 1.0
    assert em in (0.0, 1.0) and cover in (0.0, 1.0)
    assert hf1 <= f1  # HotpotQA's rule only ever takes credit away
    if em == 1.0:  # an exact match is covered, and a full F1 unless both sides normalize to "" (SQuAD: F1 0)
        assert cover == 1.0
        assert f1 == pytest.approx(1.0) or not metrics.normalize(pred)


@settings(max_examples=200, deadline=None)
@given(a=st.text(max_size=30), b=st.text(max_size=30))
def test_token_f1_is_symmetric_and_self_match_is_full(a, b):
    assert metrics.token_f1(a, b) == pytest.approx(metrics.token_f1(b, a))
    if metrics.normalize(a):
        assert metrics.f1(a, [a]) == pytest.approx(1.0) and metrics.em(a, [a]) == 1.0
    assert metrics.normalize(metrics.normalize(a)) == metrics.normalize(a)  # idempotent
