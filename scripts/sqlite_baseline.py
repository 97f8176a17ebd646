"""The no-agent baseline of the real-text benchmark: the top-k retrieved passages in the prompt.

For every test question: BM25 top-k (default 3) passages of the benchmark's own index for the
question text, put into one user message with the question; the model answers greedily in one
short generation, no tools, no turns. Scored with the same official scorers as `atom eval`, and
written as an answered table so `atom eval --compare` can pair it with an agent's eval:

    python scripts/sqlite_baseline.py --world runs/real --model smollm2 --out runs/real/top3.parquet
    atom eval runs/real/top3.parquet --out top3.json
    atom eval runs/eval/step-0010.parquet --out agent.json --compare runs/real/top3.parquet

The other baseline, the base model in the agent loop, is `atom eval TEST --model smollm2 --search local:INDEX`.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = ("Answer the question with a short phrase (a name, a number or a few words), using the passages.\n\n"
          "{passages}\n\nQuestion: {question}\nAnswer:")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", required=True, help="folder written by `atom demo-world --real sqlite`")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--split", default="test")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", required=True, help="answered table (Parquet or .jsonl)")
    args = ap.parse_args()

    import pyarrow as pa
    import torch

    from atomcli import models, schema, tableio
    from atomcli.context import Context
    from atomcli.env.search_local import LocalIndex

    world = Path(args.world)
    questions = tableio.read_table(str(world / f"{args.split}.jsonl")).to_pylist()
    index = LocalIndex(str(world / "index.sqlite"))
    model, tok = models.load(args.model, Context())
    prompts = []
    for q in questions:
        hits = index.search(q["question"], args.k)
        passages = "\n\n".join(f"[{i + 1}] {h['title']}\n{index.read_local(h['url']) or h['snippet']}"
                               for i, h in enumerate(hits))
        prompts.append(tok.apply_chat_template([{"role": "user", "content": PROMPT.format(
            passages=passages, question=q["question"])}], tokenize=False, add_generation_prompt=True))
    answers = []
    for s in range(0, len(prompts), args.batch):
        enc = tok(prompts[s:s + args.batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id)
        for row in out[:, enc["input_ids"].shape[1]:]:
            text = tok.decode(row, skip_special_tokens=True).strip()
            answers.append(re.split(r"\n", text, maxsplit=1)[0].strip())  # the first line is the answer
        print(f"{len(answers)}/{len(prompts)}", file=sys.stderr)
    keep = [*schema.QUESTION_COLUMNS, "data_source"]  # per-source scores in `atom eval`
    rows = [{**{k: q[k] for k in keep if k in q}, "answer": a, "policy": f"top{args.k}:{args.model}"}
            for q, a in zip(questions, answers)]
    table = pa.table({c: [r.get(c) for r in rows] for c in rows[0]})
    tableio.write_table(table, args.out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
