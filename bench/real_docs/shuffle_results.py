"""Permute the search results inside the real-text SFT rows (no model run; issue 20, session 34).

The real expert rewrites its query until the answer's passage is in the results, so in its final search response
the answer's passage is result 1 two times in three (`bench/real_docs/positions.py`): a policy can learn "quote
from the first result" instead of "quote the sentence that answers the question". This writes a copy of an SFT
table in which each real-text row's search responses have their results put in a seeded random order (numbers
rewritten 1..k), with probability P per row, and with `--sentences` each result's snippet its sentences too (the
policy of session 34 quotes the snippet's first sentence when the answer is in a later one); the assistant turns are unchanged (they name results by title and
url, never by position) and the demo rows are copied as they are.

    python bench/real_docs/shuffle_results.py runs/s34/w/sft.parquet runs/s34/shuf_sft.parquet --p 0.5
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reading import QUOTE_RE  # noqa: E402 (a quoted sentence, as reading.py and positions.py find them)

ITEM_START = re.compile(r"(?m)^(\d+)\. ")


def shuffle_snippet(item: str, rng: random.Random, keep: list[str]) -> str:
    """One result (title, url and snippet lines) with its snippet's sentences in a random order; the snippet's
    leading and trailing "…" stay where they are. Unchanged when a string of `keep` (the row's quotes) that the
    snippet holds would no longer be in it (a quote the sentence splitter would cut in two)."""
    from atomcli.env.search_local import split_snippet
    lines = item.rstrip("\n").split("\n")
    if len(lines) < 3:
        return item
    indent, snippet = lines[2][:len(lines[2]) - len(lines[2].lstrip())], lines[2].strip()
    head, sentences, tail = split_snippet(snippet)
    if len(sentences) < 2:
        return item
    rng.shuffle(sentences)
    new = head + " ".join(sentences) + tail
    if any(k in snippet and k not in new for k in keep):
        return item
    return "\n".join(lines[:2] + [indent + new] + lines[3:]) + "\n"


def shuffle_response(text: str, rng: random.Random, sentences: bool = False, keep: list[str] = ()) -> str:
    """A search response with its numbered results in a random order, renumbered; other text unchanged.
    sentences: each result's snippet also has its sentences reordered (`shuffle_snippet`)."""
    starts = [m.start() for m in ITEM_START.finditer(text)]
    if len(starts) < 2 or "Results for" not in text[:starts[0]]:
        return text  # a page, or one result: nothing to reorder
    end = text.rfind("</tool_response>")
    end = end if end > starts[-1] else len(text)
    head, tail = text[:starts[0]], text[end:]
    items = [text[a:b] for a, b in zip(starts, starts[1:] + [end])]
    items = [it if it.endswith("\n") else it + "\n" for it in items]  # the last item may lack its newline
    if sentences:
        items = [shuffle_snippet(it, rng, list(keep)) for it in items]
    order = list(range(len(items)))
    rng.shuffle(order)
    body = "".join(ITEM_START.sub(f"{i + 1}. ", items[j], count=1) for i, j in enumerate(order))
    return head + body + tail if tail else head + body.rstrip("\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dest")
    ap.add_argument("--p", type=float, default=0.5, help="share of the real rows whose results are reordered")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sentences", action="store_true",
                    help="also reorder the sentences inside each result's snippet (the quoted sentence stays whole)")
    a = ap.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq
    from atomcli import tableio
    table = pq.read_table(a.src)
    rows = table.to_pylist()
    rng = random.Random(f"shuffle-results:{a.seed}")
    moved = 0
    for row in rows:
        if "sqlite" not in str(row.get("data_source")) or rng.random() >= a.p:
            continue
        quotes = [q for m in row["messages"] if m["role"] == "assistant" for q in QUOTE_RE.findall(m["content"])]
        for m in row["messages"]:
            if m["role"] == "tool":
                new = shuffle_response(m["content"], rng, a.sentences, quotes)
                moved += new != m["content"]
                m["content"] = new
    out = tableio.table_bytes(pa.Table.from_pylist(rows, schema=table.schema), "parquet")
    Path(a.dest).write_bytes(out)
    print(f"{a.dest}: {len(rows)} rows, {moved} search responses reordered")


if __name__ == "__main__":
    main()
