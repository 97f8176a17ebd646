"""Outcome metrics (DESIGN.md §5): SQuAD normalization, token F1, EM, cover-EM, set-F1.

Used by `aggregate-reward`, `eval` and the demo world's sanity checks. Every function is
total: any prediction (None, empty, odd unicode) gets a defined score in [0, 1].
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation) | {"\u2018", "\u2019", "\u201c", "\u201d", "\u2013", "\u2014", "\u2026"}


def normalize(text, *, keep_articles: bool = False) -> str:
    """Lower-case, strip punctuation and (unless kept) articles, collapse whitespace."""
    if text is None:
        return ""
    s = unicodedata.normalize("NFKC", str(text)).lower()
    s = "".join(" " if (ch in _PUNCT or unicodedata.category(ch).startswith("P")) else ch for ch in s)
    if not keep_articles:
        s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _golds(golden) -> list[str]:
    if golden is None:
        return []
    if isinstance(golden, str):
        return [golden]
    return [g for g in golden if g is not None]


def token_f1(pred, gold) -> float:
    p, g = normalize(pred).split(), normalize(gold).split()
    if not p or not g:  # an empty prediction (or a gold that normalizes to nothing) scores 0
        return 0.0
    common = Counter(p) & Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def set_f1(pred, gold) -> float:
    """DeepResearcher's variant: token *sets*, articles kept."""
    p, g = set(normalize(pred, keep_articles=True).split()), set(normalize(gold, keep_articles=True).split())
    if not p or not g:
        return 0.0
    same = len(p & g)
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def f1(pred, golden, variant: str = "token") -> float:
    """Max F1 over golden answers. `variant`: token (SQuAD) or set (DeepResearcher)."""
    fn = {"token": token_f1, "set": set_f1}.get(variant)
    if fn is None:
        raise ValueError(f"unknown F1 variant `{variant}` (valid: set, token)")
    return max((fn(pred, g) for g in _golds(golden)), default=0.0)


def em(pred, golden) -> float:
    p = normalize(pred)
    return float(bool(p) and any(p == normalize(g) for g in _golds(golden)))


def cover_em(pred, golden) -> float:
    """A normalized golden answer appears (as whole tokens) in the normalized prediction."""
    p = f" {normalize(pred)} "
    return float(any(normalize(g) and f" {normalize(g)} " in p for g in _golds(golden)))
