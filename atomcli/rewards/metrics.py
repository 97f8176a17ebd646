"""Outcome metrics (docs/design.md, "Outcome metrics"): the official scorers' F1, EM and cover-EM, nothing else.

Owns the scorer names (`F1_VARIANTS`, `SCORERS`) that `aggregate-reward`, `eval` and their
reports use, and the functions they name. Each reproduces its official script exactly
(tests/data/metric_cases.jsonl pins them case by case):

    squad   SQuAD v1.1 `evaluate-v1.1.py`: lower-case, ASCII punctuation (string.punctuation)
            *deleted*, articles a/an/the removed, whitespace collapsed; bag-of-tokens F1. The default.
    hotpot  HotpotQA `hotpot_evaluate_v1.py` (= FlashRAG's `F1_Score`): squad's F1, but 0 unless
            prediction and gold agree when either normalizes to yes / no / noanswer.
    set     DeepResearcher's reward (`verl/utils/reward_score/format_and_f1.py`): lower-case,
            ASCII punctuation replaced by a space, articles kept; F1 over token *sets*.
    token   alias of squad (older configs).
    em      SQuAD's exact match: 1 when the normalized strings are equal, empty ones included
            ("A" vs "the" is 1, as officially).
    cover_em  FlashRAG's sub-EM (`acc`): the normalized gold is a *substring* of the normalized
            prediction (so "art" covers "stuttgart", and a gold normalizing to "" covers anything).

No Unicode normalization (NFKC) and no Unicode punctuation: the official scripts have none, so
curly quotes, dashes and full-width letters are ordinary characters. Over several golden
answers every metric takes the max (SQuAD's `metric_max_over_ground_truths`, FlashRAG's
loops, DeepResearcher's `<|answer_split|>` loop). Every function is total: a None prediction
scores 0 (SQuAD gives an unanswered question 0), None golds are skipped, no gold at all
scores 0, anything else is str()-ed; every score is a float in [0, 1].
"""

from __future__ import annotations

import re
import string
from collections import Counter

# The scorer names, defined once: other modules import these rather than retyping strings.
F1_VARIANTS = ("squad", "hotpot", "set", "token")   # accepted by --f1
F1_ALIASES = {"token": "squad"}
DEFAULT_F1 = "squad"
EM_SCORER = "squad"
COVER_EM_SCORER = "flashrag-sub-em"
SCORERS = {
    "squad": "SQuAD v1.1 token F1 (evaluate-v1.1.py)",
    "hotpot": "HotpotQA token F1 with the yes/no/noanswer rule (hotpot_evaluate_v1.py; FlashRAG F1_Score)",
    "set": "DeepResearcher token-set F1, articles kept (verl/utils/reward_score/format_and_f1.py)",
    "flashrag-sub-em": "FlashRAG sub-EM `acc`: normalized gold is a substring of the normalized prediction",
}

_PUNCT = frozenset(string.punctuation)                         # ASCII only, as every official script
_TO_SPACE = str.maketrans({ch: " " for ch in string.punctuation})
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = ("yes", "no", "noanswer")


def f1_scorer(variant: str) -> str:
    """The scorer an `--f1` value names (`token` -> `squad`); ValueError listing the valid names."""
    if variant not in F1_VARIANTS:
        raise ValueError(f"unknown F1 variant `{variant}` (valid: {', '.join(F1_VARIANTS)})")
    return F1_ALIASES.get(variant, variant)


def scorers(variant: str = DEFAULT_F1) -> dict:
    """Which official scorer each reported number comes from, e.g. for an eval report."""
    return {"f1": f1_scorer(variant), "em": EM_SCORER, "cover_em": COVER_EM_SCORER}


def normalize(text) -> str:
    """SQuAD v1.1's normalize_answer: lower, delete ASCII punctuation, drop articles, collapse spaces."""
    if text is None:
        return ""
    s = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)  # lower first, as officially
    return " ".join(_ARTICLES.sub(" ", s).split())


def set_tokens(text) -> set[str]:
    """DeepResearcher's preprocess_text after its lower(): punctuation -> space, split, as a set."""
    if text is None:
        return set()
    return set(str(text).lower().translate(_TO_SPACE).split())


def _golds(golden) -> list:
    if golden is None:
        return []
    if isinstance(golden, str):
        return [golden]
    return [g for g in golden if g is not None]


def _bag_f1(p: list[str], g: list[str]) -> float:
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:  # also covers an empty side: SQuAD scores it 0
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_f1(pred, gold) -> float:
    """SQuAD v1.1 f1_score for one gold."""
    if pred is None or gold is None:
        return 0.0
    return _bag_f1(normalize(pred).split(), normalize(gold).split())


token_f1 = squad_f1  # the `token` alias


def hotpot_f1(pred, gold) -> float:
    """HotpotQA f1_score for one gold: 0 unless yes/no/noanswer agree."""
    if pred is None or gold is None:
        return 0.0
    p, g = normalize(pred), normalize(gold)
    if (p in _YES_NO or g in _YES_NO) and p != g:
        return 0.0
    return _bag_f1(p.split(), g.split())


def set_f1(pred, gold) -> float:
    """DeepResearcher's F1 for one gold: token sets, articles kept."""
    p, g = set_tokens(pred), set_tokens(gold)
    same = len(p & g)
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


_F1 = {"squad": squad_f1, "hotpot": hotpot_f1, "set": set_f1}


def f1(pred, golden, variant: str = DEFAULT_F1) -> float:
    """Max F1 over golden answers with the scorer `variant` names (see F1_VARIANTS)."""
    fn = _F1[f1_scorer(variant)]
    if pred is None:
        return 0.0
    return max((fn(pred, g) for g in _golds(golden)), default=0.0)


def em(pred, golden) -> float:
    """SQuAD exact match, max over golden answers (1 when both normalize to the same, even empty)."""
    if pred is None:
        return 0.0
    p = normalize(pred)
    return float(any(p == normalize(g) for g in _golds(golden)))


def cover_em(pred, golden) -> float:
    """FlashRAG sub-EM: some normalized golden answer is a substring of the normalized prediction."""
    if pred is None:
        return 0.0
    p = normalize(pred)
    return float(any(normalize(g) in p for g in _golds(golden)))
