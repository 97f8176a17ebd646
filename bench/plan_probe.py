"""Does a policy's first plan depend on the question? (bench/LEARNING.md, session 16)

The classic demo expert opens every trajectory with a <PLAN> that either looks one fact up ("Find X.",
"Look up X directly.") or names the hop count ("This is a 3-hop question. ...", "Break the question into
3 lookups ...", "The chain has 3 links ..."). A policy that has learned to read the question should put
more probability on the one-lookup openings for 1-hop questions, and on the right digit after "This is
a", than for 4-hop ones. This reads both distributions straight from the model (one forward pass per
question, no sampling) for the questions of an answered eval table, averaged by the question's hop count:

- P(first plan word): "This", "Break", "The" (the multi-hop openings), "Find", "Look" (the 1-hop ones);
- P(hop digit | "<PLAN>This is a"): 1, 2, 3, 4.

    python bench/plan_probe.py runs/learning/sft/sft runs/learning/sft/eval/sft.parquet
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

OPENINGS = ("This", "Break", "The", "Find", "Look")
DIGITS = "1234"
PLAN = "<think><PLAN>"


def probe(model_dir: str, table_path: str) -> tuple[dict, collections.Counter]:
    import torch

    from atomcli import models, tableio
    from atomcli.stages.run_all import question_hops
    model, tok = models.load(model_dir)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    opening = {w: enc(PLAN + w)[len(enc(PLAN))] for w in OPENINGS}
    head = enc(PLAN + "This is a")
    digit_ids = {}
    for d in DIGITS:  # SmolLM2 writes " 3-hop" as a space token, then the digit
        full = enc(f"{PLAN}This is a {d}-hop")
        assert full[:len(head)] == head
        digit_ids[d] = full[len(head):len(head) + 2]  # [space, digit]; "-hop" follows
    space = digit_ids["1"][:1]
    assert all(v[:1] == space for v in digit_ids.values())           # the same space token before each digit
    assert len({v[1] for v in digit_ids.values()}) == len(digit_ids)   # and one token per digit
    table = tableio.read_table(table_path)
    sums: dict = collections.defaultdict(lambda: collections.defaultdict(float))
    n: collections.Counter = collections.Counter()
    for hops, messages in zip(question_hops(table), table.column("messages").to_pylist()):
        prompt = tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
        with torch.no_grad():
            p = torch.softmax(model(torch.tensor([enc(prompt + PLAN)])).logits[0, -1].float(), -1)
            q = torch.softmax(model(torch.tensor([enc(prompt + PLAN + "This is a") + space])).logits[0, -1].float(), -1)
        for w, i in opening.items():
            sums[hops][w] += float(p[i])
        for d, ids in digit_ids.items():
            sums[hops][d] += float(q[ids[-1]])
        n[hops] += 1
    return sums, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="checkpoint folder")
    ap.add_argument("table", help="an answered eval table of the demo world's test split (its questions)")
    args = ap.parse_args()
    sums, n = probe(args.model, args.table)
    print("| hops | questions | " + " | ".join(f'P("{w}")' for w in OPENINGS) + " | "
          + " | ".join(f"P({d}-hop)" for d in DIGITS) + " |")
    print("|---" * (2 + len(OPENINGS) + len(DIGITS)) + "|")
    for h in sorted(n):
        cells = [f"{sums[h][k] / n[h]:.3f}" for k in (*OPENINGS, *DIGITS)]
        print(f"| {h} | {n[h]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
