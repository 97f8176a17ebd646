"""The files a user reads stand alone: a README of one screenful's worth of sections, and no development history
(session, issue or review-round numbers) or design brief outside the repository cited anywhere a user looks."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# built from pieces so that this file does not match itself
# ("round 2" stays allowed: rejection sampling has rounds; a review round is named in words)
HISTORY = re.compile(r"\b(" + "|".join(["sess" + r"ions? \d", "iss" + r"ues? \d", r"(review )?round (two|three)\b",
                                        "(?-i:DES" + r"IGN\.md)", r"\bs\d\d(r\d+)?\b"]) + ")", re.I)
PRODUCT = ["README.md", "CHANGELOG.md", "docs", "atomcli", "examples", "tests", "scripts", "bench"]
SUFFIXES = {".md", ".py", ".toml", ".sh"}


def _files():
    for name in PRODUCT:
        p = ROOT / name
        for f in ([p] if p.is_file() else sorted(p.rglob("*"))):
            if f.is_file() and f.suffix in SUFFIXES and f.resolve() != Path(__file__).resolve():
                yield f


def test_readme_is_short_with_no_line_over_300_characters():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    assert [i + 1 for i, line in enumerate(lines) if len(line) > 300] == []


def test_no_product_file_names_development_history_or_an_outside_brief():
    found = []
    for f in _files():
        for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            m = HISTORY.search(line)
            if m:
                found.append(f"{f.relative_to(ROOT)}:{i}: {m[0]}")
    assert found == []


def test_the_history_pattern_catches_what_it_is_for():
    for bad in ("measured in sess" "ion 46", "see iss" "ue 20", "Round two", "DES" "IGN.md", "runs/s46"):
        assert HISTORY.search(bad), bad
    for fine in ("rejection-sampling round 1", "the session's cookie", "issues a request", "s3 bucket",
                 "vLLM iss" "ue #32718", "docs/design.md"):
        assert not HISTORY.search(fine), fine
