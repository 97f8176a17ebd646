"""Where an agent loses real-text questions: search, reading, or copying the question (no model run).

For every answered table given (an `atom eval` or run-all `eval/**/NAME.parquet`), each trajectory is put in one
of four classes:

- right: F1 >= 0.5 against a golden answer;
- copied: wrong, and the answer is a piece of the question or of the agent's own search queries (the failure of a
  policy that learned the expert's query wording but not where the answer sits in the text it read);
- lost in reading: wrong, not copied, and a golden answer occurs in a tool response the agent saw;
- not found: wrong, and no tool response held a golden answer.

The counts tell which side of issue 20 a change moved: "answer in hand" is what search gave the agent, and
right / answer-in-hand is how well it read. For the answer-in-hand trajectories the last turn's quote (the experts
quote the sentence that states the answer before answering) is also counted: it holds a golden answer, it is
another sentence (the agent picked the wrong one), or the turn quotes nothing. "Anchored" counts the answer-in-hand
trajectories whose last REFLECTION names a piece of that quote (session 36's expert writes the question's word beside
the answer: `It says "defaults to OFF", so the answer is OFF`), then how many of those pieces hold a golden answer
and how many of those trajectories were answered right. "Two quotes" counts the
answer-in-hand trajectories whose last turn quotes two sentences (session 32's real expert sets a rival sentence
against the answer's) and, in parentheses, how many of them were answered right. For those pairs it also counts
where a golden answer stands (the first quote, the second) and which one the last REFLECTION names ("the first",
"the second"; session 37: the expert always put the answer's sentence second, and its policy always named the
second), and how many named quotes hold a golden answer.

    python bench/real_docs/reading.py runs/s26/sr/eval/transfer/sft.parquet runs/s26/srrl/eval/transfer/*.parquet
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CLASSES = ("right", "copied", "lost in reading", "not found")
QUOTES = ("quote holds it", "quoted another", "no quote")
QUOTE_RE = re.compile(r'"([^"]{8,})"')  # a quoted sentence, not a quoted word


REFLECTION_RE = re.compile(r"<REFLECTION>(.*?)</REFLECTION>", re.DOTALL)
ANCHOR_RE = re.compile(r'"([^"]{3,})"')


def last_turn(row: dict) -> str:
    turns = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    return turns[-1].split("<answer>")[0] if turns else ""


def last_quotes(row: dict) -> list[str]:
    """The sentences the last turn quotes (outside its REFLECTION units, where an anchor phrase stands)."""
    return QUOTE_RE.findall(REFLECTION_RE.sub("", last_turn(row)))


def anchor(row: dict) -> str | None:
    """The phrase the last turn's last REFLECTION quotes from its own quote (session 36's `It says "defaults to
    OFF", so the answer is OFF`), or None."""
    units = REFLECTION_RE.findall(last_turn(row))
    found = ANCHOR_RE.findall(units[-1]) if units else []
    said = " ".join(last_quotes(row))
    return found[-1] if found and found[-1] in said else None


def _pick_pattern(template: str) -> re.Pattern:
    """One of the expert's "pick" phrases as a regex: {which} is the group, every other field any text."""
    parts = re.split(r"(\{\w+\})", template)
    body = "".join("(?P<which>first|second)" if p == "{which}" else ".*?" if re.fullmatch(r"\{\w+\}", p)
                   else re.escape(p) for p in parts)
    return re.compile(body, re.DOTALL)


@functools.cache
def _pick_patterns() -> tuple[re.Pattern, ...]:
    """The expert's pick phrases, compiled once (named() runs on every answered row)."""
    from atomcli.demo.research_expert import PHRASES
    return tuple(_pick_pattern(t) for t in PHRASES["pick"])


def named(row: dict) -> str | None:
    """"first" or "second": the quote of a pair that the last REFLECTION picks in one of the expert's "pick"
    phrases ("which only the second states"), or None when it uses none of them. Matched on the template, so a
    question's own "first" or "second" (the {cue} field) is not taken for the pick."""
    units = REFLECTION_RE.findall(last_turn(row))
    if not units:
        return None
    for pattern in _pick_patterns():
        found = pattern.search(units[-1])
        if found:
            return found.group("which")
    return None


def holds_gold(row: dict, text: str) -> bool:
    """`text` holds one of the row's golden answers (both normalized as the F1 scorer does)."""
    from atomcli.rewards import metrics
    golds = [metrics.normalize(g) for g in row["golden_answers"] if metrics.normalize(g)]
    return any(g in metrics.normalize(text) for g in golds)


def quoted(row: dict) -> str:
    """Where the last turn's quote stands: it holds a golden answer, it is another sentence, or there is none."""
    said = last_quotes(row)
    if not said:
        return "no quote"
    return "quote holds it" if holds_gold(row, " ".join(said)) else "quoted another"


def classify(row: dict) -> tuple[str, bool]:
    """(class, golden answer seen in a tool response) of one answered trajectory."""
    from atomcli.rewards import metrics
    golds = [g for g in row["golden_answers"] if metrics.normalize(g)]
    seen = " ".join(m["content"] for m in row["messages"] if m["role"] == "tool")
    in_hand = any(metrics.normalize(g) in metrics.normalize(seen) for g in golds)
    answer = row["answer"] or ""
    if answer and metrics.f1(answer, golds) >= 0.5:
        return "right", in_hand
    queries = " ".join(call["arguments"] or "" for call in row["tool_calls"] or [])
    said = metrics.normalize(answer)
    if len(said) > 3 and (said in metrics.normalize(row["question"]) or said in metrics.normalize(queries)):
        return "copied", in_hand
    return ("lost in reading" if in_hand else "not found"), in_hand


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+", type=Path, help="answered tables (eval parquet files)")
    ap.add_argument("--json", action="store_true", help="one JSON object per table instead of a Markdown table")
    args = ap.parse_args()
    import pyarrow.parquet as pq
    if not args.json:
        print("| table | n | answer in hand | right (in hand) | copied | lost in reading | not found | in hand: quote "
              "holds it / quoted another / no quote | in hand: two quotes (right) | in hand: anchored / holds it / "
              "right | two quotes: answer in 1st / 2nd; names 1st / 2nd; named holds it |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    for path in args.tables:
        if "answer" not in pq.read_schema(path).names:  # e.g. eval/questions.parquet caught by a glob
            print(f"{path}: not an answered table (no `answer` column), skipped", file=sys.stderr)
            continue
        rows = pq.read_table(path, columns=["question", "golden_answers", "answer", "messages",
                                            "tool_calls"]).to_pylist()
        counts = dict.fromkeys(CLASSES, 0)
        quotes = dict.fromkeys(QUOTES, 0)  # over the answer-in-hand trajectories
        in_hand = right_in_hand = pairs = pairs_right = anchored = anchor_holds = anchored_right = 0
        pair = dict.fromkeys(("gold_first", "gold_second", "names_first", "names_second", "named_holds_it"), 0)
        for row in rows:
            cls, seen = classify(row)
            counts[cls] += 1
            in_hand += seen
            right_in_hand += seen and cls == "right"
            if seen:
                quotes[quoted(row)] += 1
                piece = anchor(row)
                if piece is not None:
                    anchored += 1
                    anchor_holds += holds_gold(row, piece)
                    anchored_right += cls == "right"
                if len(last_quotes(row)) >= 2:
                    pairs += 1
                    pairs_right += cls == "right"
                    said, which = last_quotes(row), named(row)
                    pair["gold_first"] += holds_gold(row, said[0])
                    pair["gold_second"] += holds_gold(row, said[1])
                    if which is not None:
                        pair["names_" + which] += 1
                        pair["named_holds_it"] += holds_gold(row, said[0 if which == "first" else 1])
        if args.json:
            print(json.dumps({"table": str(path), "n": len(rows), "answer_in_hand": in_hand,
                              "right_in_hand": right_in_hand, **counts, **quotes, "two_quotes": pairs,
                              "two_quotes_right": pairs_right, "anchored": anchored, "anchor_holds_it": anchor_holds,
                              "anchored_right": anchored_right, **pair}))
        else:
            print(f"| {path} | {len(rows)} | {in_hand} | {counts['right']} ({right_in_hand}) | {counts['copied']} | "
                  f"{counts['lost in reading']} | {counts['not found']} | "
                  f"{' / '.join(str(quotes[q]) for q in QUOTES)} | {pairs} ({pairs_right}) | "
                  f"{anchored} / {anchor_holds} / {anchored_right} | {pair['gold_first']} / {pair['gold_second']}; "
                  f"{pair['names_first']} / {pair['names_second']}; {pair['named_holds_it']} |")


if __name__ == "__main__":
    main()
