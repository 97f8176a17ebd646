"""Where the last quote and the answer sit among the search results of real-text rows (no model run; issue 20).

For each real-text row of an SFT table or an answered table (`atom eval --answers`), the last tool response is
split into its numbered results (a browsed page counts as position 0); the row is counted by the position of the
result that holds a golden answer, the position of the result its last turn quotes from, and whether they agree.
A policy that quotes result 1 when the answer is in result 2 or 3 reads by position, not by content. Inside the
result that holds the answer, when the last turn quotes from it, the same is counted one level down: is the answer
in the snippet's first sentence, is the quote its first sentence (session 34: the policy quotes the first sentence
when the answer is in a later one), and whether the answer's sentence and the quoted one are those that share the
most words with the question (ties count for each): a policy that reads by content quotes the sentence that
matches the question, not the first one.

    python bench/real_docs/positions.py runs/s34/w/sft.parquet runs/s34/one/transfer.parquet
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reading import last_quotes  # noqa: E402 (the last turn's quotes, parsed as reading.py counts them)

ITEM_SPLIT = re.compile(r"(?m)^(\d+)\. ")


def results(response: str) -> list[tuple[int, str]]:
    """[(position, text)] of a search response; [(0, text)] for anything else (a page)."""
    parts = ITEM_SPLIT.split(response)
    if len(parts) < 3 or "Results for" not in parts[0]:  # a page may hold numbered lines too
        return [(0, response)]
    return [(int(parts[i]), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def positions(row: dict) -> tuple | None:
    """(answer's position, quote's position) in the last tool response; None: no tool response.
    Either is None when not found there; the quote's is "none" when the last turn quotes nothing."""
    from atomcli.rewards import metrics
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    tools = [m["content"] for m in row["messages"] if m["role"] == "tool"]
    if not turns or not tools:
        return None
    items = results(tools[-1])
    golds = [metrics.normalize(g) for g in row["golden_answers"] if metrics.normalize(g)]
    answer = next((n for n, text in items if any(g in metrics.normalize(text) for g in golds)), None)
    said = last_quotes(row)
    if not said:
        return answer, "none"
    quote = metrics.normalize(said[-1])
    return answer, next((n for n, text in items if quote and quote in metrics.normalize(text)), None)


STOPWORDS = frozenset("a an and are as at be by does do for from how in is it its of on or that the this to was "
                      "what when which with".split())


def sentence_places(row: dict, places: tuple | None = None) -> tuple | None:
    """(the answer's sentence, the quote's sentence, the indexes of the sentences that share the most non-stopword
    words with the question) by index in the snippet (or page) of the last response's result that holds the answer,
    when the last turn quotes from that result; None otherwise. An index is None when no sentence holds it (a quote
    that spans two sentences). places: `positions(row)` when the caller has it already."""
    from atomcli.env.reader import split_sentences
    from atomcli.rewards import metrics
    p = places if places is not None else positions(row)
    if not p or p[0] is None or p[1] != p[0]:
        return None
    tools = [m["content"] for m in row["messages"] if m["role"] == "tool"]
    text = dict(results(tools[-1]))[p[0]]
    if p[0]:
        text = text.split("\n", 2)[-1]  # a result: drop its title and url lines
    sentences = [metrics.normalize(s) for s in split_sentences(text.strip())]
    quote = metrics.normalize(last_quotes(row)[-1])
    golds = [metrics.normalize(g) for g in row["golden_answers"] if metrics.normalize(g)]
    answer = next((i for i, s in enumerate(sentences) if any(g in s for g in golds)), None)
    quoted = next((i for i, s in enumerate(sentences) if quote and quote in s), None)
    words = set(metrics.normalize(row.get("question") or "").split()) - STOPWORDS
    shared = [len(words & set(s.split())) for s in sentences]
    return answer, quoted, {i for i, n in enumerate(shared) if n == max(shared)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+")
    a = ap.parse_args(argv)
    import pyarrow.parquet as pq
    from atomcli.rewards import metrics
    for path in a.tables:
        rows = [r for r in pq.read_table(path).to_pylist() if "sqlite" in str(r.get("data_source"))]
        answer_at, quote_at, cells = collections.Counter(), collections.Counter(), collections.Counter()
        inside, overlap = collections.Counter(), collections.Counter()
        for r in rows:
            p = positions(r)
            if p is None:
                continue
            answer_at[p[0]] += 1
            quote_at[p[1]] += 1
            right = bool(r.get("answer")) and metrics.f1(r["answer"], r["golden_answers"]) >= 0.5
            if (sp := sentence_places(r, p)) is not None:
                inside[("answer in sentence 1" if sp[0] == 0 else "answer later",
                        "quote is sentence 1" if sp[1] == 0 else "quote later" if sp[1] else "quote spans two",
                        "right" if right else "wrong")] += 1
                if sp[0] is not None and sp[1] is not None:
                    overlap[("answer's sentence shares the most question words" if sp[0] in sp[2] else
                             "answer's sentence does not", "so does the quote's" if sp[1] in sp[2] else
                             "the quote's does not")] += 1
            if p[0] is not None:
                cells[("answer at 1" if p[0] == 1 else "answer at 0 (page)" if p[0] == 0 else "answer at 2-3",
                       "quote there" if p[1] == p[0] else "quote at 1" if p[1] == 1 else "quote elsewhere",
                       "right" if right else "wrong")] += 1
        print(f"{path}: {len(rows)} real-text rows")
        print(f"  answer's result in the last response: {dict(sorted(answer_at.items(), key=str))}")
        print(f"  last quote's result: {dict(sorted(quote_at.items(), key=str))}")
        for key in sorted(cells):
            print(f"  {' / '.join(key)}: {cells[key]}")
        print("  inside the answer's result, when the last turn quotes from it:")
        for key in sorted(inside):
            print(f"    {' / '.join(key)}: {inside[key]}")
        for key in sorted(overlap):
            print(f"    {' / '.join(key)}: {overlap[key]}")


if __name__ == "__main__":
    main()
