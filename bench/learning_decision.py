"""Where the "search again or answer?" decision sits, and how RL moved it (the learning study).

The stepwise SFT policy makes that decision in the first words of its <REFLECTION> after an observation:
"The question is now: ..." / "What remains to answer ..." lead to another search, "That settles it: ..." /
"Nothing is left to look up ..." to the answer. This script takes one answered eval table (the SFT's greedy
test episodes), cuts every episode just after the "<REFLECTION>" of its second turn (the first decision after
a search), and asks each checkpoint for the log-probability of the two families of openings on exactly that
context (teacher-forced, so every checkpoint judges the same evidence). Per hop count it prints the mean margin
log P(answer) - log P(search again) and how often each checkpoint's preferred branch is the right one (answer
for 1-hop questions, search again for more hops), and for each later checkpoint how much of its move is one
shift shared by every context (the mean) and how much differs between contexts (the std of the per-context
shift, and its difference between 1-hop and 2-hop contexts). A policy that learned *when* to stop moves
1-hop and 2-hop contexts apart; a policy that only learned to stop earlier moves them together.

    python bench/learning_decision.py runs/s18/sft/eval/sft.parquet runs/s18/sft/sft \
        runs/s20/force/steps/0005/ckpt runs/s19/fail-t07-bal/steps/0005/ckpt
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys

STOP = ("That settles it:", "Nothing is left to look up")
AGAIN = ("The question is now:", "What remains to answer")
TAG = "<REFLECTION>"
TURN = "<|im_start|>assistant\n"


def contexts(table_path: str, tok) -> list[tuple[str, int, str]]:
    """(question id, hop count, text up to the second turn's <REFLECTION>) per usable episode."""
    import pyarrow.parquet as pq
    from atomcli.stages.run_all import question_hops
    t = pq.read_table(table_path)
    hops = question_hops(t)
    out = []
    for row, h in zip(t.to_pylist(), hops):
        text = tok.decode(row["prompt_ids"] + row["completion_ids"], skip_special_tokens=False)
        starts = [i for i in range(len(text)) if text.startswith(TURN, i)]
        if len(starts) < 2:
            continue  # answered (or failed) in the first turn: no decision after an observation
        j = text.find(TAG, starts[1], starts[2] if len(starts) > 2 else len(text))
        if j >= 0:
            out.append((row["id"], h, text[:j + len(TAG)]))
    return out


def margins(model_dir: str, ctxs, tok) -> list[float]:
    """log P(answer openings) - log P(search-again openings) per context under one checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for _, _, prefix in ctxs:
            p_ids = tok(prefix, add_special_tokens=False)["input_ids"]
            out_kv = model(torch.tensor([p_ids]), use_cache=True)
            scores = {}
            for phrase in STOP + AGAIN:
                c_ids = tok(phrase, add_special_tokens=False)["input_ids"]
                logits = model(torch.tensor([c_ids]), past_key_values=_copy(out_kv.past_key_values)).logits[0]
                lp = torch.log_softmax(torch.cat([out_kv.logits[0, -1:], logits[:-1]]).float(), -1)
                scores[phrase] = float(lp[torch.arange(len(c_ids)), torch.tensor(c_ids)].sum())
            lse = lambda xs: max(xs) + math.log(sum(math.exp(x - max(xs)) for x in xs))
            out.append(lse([scores[p] for p in STOP]) - lse([scores[p] for p in AGAIN]))
    return out


def _copy(kv):
    import copy
    return copy.deepcopy(kv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="an answered eval table (the SFT checkpoint's greedy test episodes)")
    ap.add_argument("checkpoints", nargs="+", help="checkpoint folders; the first is the reference")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.checkpoints[0])
    ctxs = contexts(args.table, tok)
    hops = sorted({h for _, h, _ in ctxs})
    print(f"{len(ctxs)} contexts (the second turn's <REFLECTION>), by hop count: "
          + ", ".join(f"{h}-hop {sum(1 for c in ctxs if c[1] == h)}" for h in hops), file=sys.stderr)
    m = {ck: margins(ck, ctxs, tok) for ck in args.checkpoints}
    ref = m[args.checkpoints[0]]
    print("| checkpoint | " + " | ".join(f"{h}-hop: margin, right branch" for h in hops)
          + " | shift vs first: mean, std | 1-hop shift - 2-hop shift |")
    print("|---|" + "---|" * len(hops) + "---|---|")
    for ck, ms in m.items():
        cells = []
        for h in hops:
            xs = [x for x, c in zip(ms, ctxs) if c[1] == h]
            right = sum(1 for x in xs if (x > 0) == (h == 1))
            cells.append(f"{statistics.mean(xs):+.2f}, {right}/{len(xs)}")
        d = [x - r for x, r in zip(ms, ref)]
        by = {h: [x for x, c in zip(d, ctxs) if c[1] == h] for h in hops}
        sep = (f"{statistics.mean(by[1]) - statistics.mean(by[2]):+.2f}" if by.get(1) and by.get(2) else "-")
        shift = "-" if ck == args.checkpoints[0] else f"{statistics.mean(d):+.2f}, {statistics.pstdev(d):.2f}"
        print(f"| {ck} | " + " | ".join(cells) + f" | {shift} | {sep if ck != args.checkpoints[0] else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
