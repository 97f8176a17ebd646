"""What search alone puts in reach on the real-text benchmark (no model run).

For every test question: the benchmark's own BM25 index is queried with the question text itself (the query a
policy that copies the question would write), and the script counts, per hop count, how often a golden answer
occurs in the top-k snippets (what the agent sees after one search) and in the top-k full pages (what browsing
those results would show). With `--report` (an `atom eval` report JSON of an agent on the same questions) it also
counts the questions whose answer was in the snippets of that one search and which the agent still got wrong
(F1 < 0.5): reading, not search, lost those. `--snippets query` searches with the local backend's query-ordered
snippets (`--search-options snippets=query`); the "lead sentence" column counts the questions whose first snippet
holding the answer holds it in its first sentence, the sentence a policy with a position habit quotes.

    atom demo-world --real sqlite --out runs/sqlite
    python scripts/sqlite_ceiling.py runs/sqlite --report agent.json   # agent.json: `atom eval ... --out agent.json`
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("world", type=Path, help="a real-text benchmark folder (test.jsonl, index.sqlite)")
    ap.add_argument("--k", type=int, default=3, help="results per search (the learn preset's k)")
    ap.add_argument("--report", help="an atom eval report JSON of an agent on the same test questions")
    from atomcli.env.search_local import PAGE_ORDER, SNIPPET_ORDERS, LocalIndex, split_snippet
    ap.add_argument("--snippets", default=PAGE_ORDER, choices=SNIPPET_ORDERS, help="the local backend's snippet order")
    args = ap.parse_args()
    idx = LocalIndex(str(args.world / "index.sqlite"), snippets=args.snippets)
    per_q = json.load(open(args.report))["per_question"] if args.report else {}
    c: dict = collections.Counter()
    for line in open(args.world / "test.jsonl", encoding="utf-8"):
        q = json.loads(line)
        gold = [a.lower() for a in q["golden_answers"]]
        found = lambda text: any(a in (text or "").lower() for a in gold)
        res = idx.search(q["question"], k=args.k)
        in_snippet = any(found(r["snippet"]) for r in res)
        in_page = any(found(idx.read_local(r["url"])) for r in res)
        holding = [r["snippet"] for r in res if found(r["snippet"])]
        lead = bool(holding) and found((split_snippet(holding[0])[1] or [""])[0])
        h = q.get("hops", 1)
        c[h, "n"] += 1
        c[h, "snippet"] += in_snippet
        c[h, "page"] += in_page
        c[h, "lead"] += lead
        if q["id"] in per_q:
            c[h, "right"] += per_q[q["id"]]["f1"] >= 0.5
            c[h, "lost"] += in_snippet and per_q[q["id"]]["f1"] < 0.5
    print(f"| hops | questions | answer in top-{args.k} snippets | of those, in the lead sentence | in top-{args.k} pages"
          + (" | agent right | in the snippets, agent wrong |" if per_q else " |"))
    print("|---|---|---|---|---|" + ("---|---|" if per_q else ""))
    for h in sorted({k[0] for k in c}):
        row = f"| {h} | {c[h, 'n']} | {c[h, 'snippet']} | {c[h, 'lead']} | {c[h, 'page']} |"
        print(row + (f" {c[h, 'right']} | {c[h, 'lost']} |" if per_q else ""))


if __name__ == "__main__":
    main()
