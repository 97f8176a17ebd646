"""Rollout throughput: the batched engine (`atom rollout`) against a naive agent loop.

Both sides answer the same questions with the same model, tools (a small local index) and
caps. The naive loop is how agent rollouts are often written (DeepResearcher re-renders the
conversation every turn): one trajectory at a time, one `model.generate` call per turn with
`stop_strings`, tool calls run one by one. The engine advances `--batch-size` trajectories
together in one KV-cached decode loop and runs each turn's tool calls concurrently.

Throughput is sampled tokens per second of wall time (tool time included on both sides).
A third side runs the engine with `--no-reuse-kv` (every turn prefills the whole context), to
show what batching alone gives. Prints one line per side and repeat, and ratios of medians.

    .venv/bin/python bench/bench_rollout.py                 # smollm2, 2 questions x G=8
    .venv/bin/python bench/bench_rollout.py --model PATH --questions 4 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from atomcli.agent import episode  # noqa: E402
from atomcli.agent import format as agent_format
from atomcli.context import Context  # noqa: E402
from atomcli.env import search_local
from atomcli.env.tools import ToolBox  # noqa: E402
from atomcli.stages import rollout

CORPUS = [
    {"id": f"d{i}", "title": title, "contents": text} for i, (title, text) in enumerate([
        ("Alice Smith", "Alice Smith was born in Paris in 1901 and painted harbours."),
        ("Bob Jones", "Bob Jones lives in Rome and writes novels about trains."),
        ("Carol White", "Carol White founded the Lyon observatory in 1950."),
        ("Dan Brown", "Dan Brown was a chemist from Oslo who studied salts."),
        ("Eve Black", "Eve Black directed the Madrid museum of maps."),
    ])
]
QUESTIONS = ["Where was Alice Smith born?", "Which city does Bob Jones live in?",
             "Who founded the Lyon observatory?", "What did Dan Brown study?",
             "Which museum did Eve Black direct?", "When was the Lyon observatory founded?"]


def naive(table: pa.Table, cfg: rollout.RolloutConfig, ctx: Context) -> tuple[int, float]:
    """One trajectory at a time, one model.generate per turn; returns (sampled tokens, seconds)."""
    import torch
    model, tok = ctx.model(cfg.model)
    tools = ToolBox(cfg.search, ctx, k=cfg.k, concurrency=1)
    system = agent_format.system_prompt(cfg.date)
    tokens, t0 = 0, time.time()
    for q_i, question in enumerate(table.column("question").to_pylist()):
        for s in range(cfg.group_size):
            torch.manual_seed(cfg.seed * 1000 + q_i * 100 + s)
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": agent_format.user_message(question)}]
            for _ in range(cfg.max_turns):
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                enc = tok(text, return_tensors="pt", add_special_tokens=False)
                with torch.inference_mode():
                    out = model.generate(**enc, max_new_tokens=cfg.max_new_tokens, do_sample=True,
                                         temperature=cfg.temperature, top_p=cfg.top_p, top_k=None,
                                         stop_strings=list(agent_format.STOP_STRINGS), tokenizer=tok,
                                         pad_token_id=tok.pad_token_id)
                new = out[0, enc["input_ids"].shape[1]:]
                tokens += int(new.shape[0])
                content = tok.decode(new, skip_special_tokens=True)
                messages.append({"role": "assistant", "content": content})
                turn = agent_format.parse_turn(content)
                if turn.answer is not None:
                    break
                call = turn.tool_call or agent_format.ToolCall("", {}, episode.NO_ACTION)
                obs = tools.run(call, f"{q_i}/{s}").observation
                messages.append({"role": "tool", "content": agent_format.tool_message(obs)})
    tools.close()
    return tokens, time.time() - t0


def engine(table: pa.Table, cfg: rollout.RolloutConfig, ctx: Context) -> tuple[int, float]:
    """`atom rollout`'s own code path; returns (sampled tokens, seconds)."""
    t0 = time.time()
    out = rollout.run(table, cfg, ctx)
    return sum(sum(m) for m in out.column("loss_mask").to_pylist()), time.time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads (0 = torch's default). On a machine shared with other jobs, 1 avoids "
                         "OpenMP oversubscription, which can slow both sides 10-20x")
    args = ap.parse_args()
    if args.threads:
        __import__("torch").set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="bench_rollout."))
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    search_local.build_index(str(tmp / "corpus.jsonl"), str(tmp / "idx.sqlite"))
    n = args.questions
    table = pa.table({"id": [f"b{i}" for i in range(n)], "question": [QUESTIONS[i % len(QUESTIONS)] for i in range(n)],
                      "golden_answers": [["x"]] * n})
    ctx = Context(quiet=True)
    cfg = rollout.RolloutConfig(model=args.model, search=f"local:{tmp / 'idx.sqlite'}", group_size=args.group_size,
                                batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                                max_turns=args.max_turns, k=3, date="2026-01-01", temperature=1.0)
    ctx.model(args.model)  # load once, outside the timings
    warm = dataclasses.replace(cfg, group_size=1, max_turns=1, max_new_tokens=2)
    rollout.run(table.slice(0, 1), warm, ctx)  # first-call costs (kernels, template compile) stay out
    print(f"model {args.model}, {n} questions x G={args.group_size}, batch {args.batch_size}, "
          f"{args.max_new_tokens} tokens/turn, {args.max_turns} turns, torch threads "
          f"{__import__('torch').get_num_threads()}", file=sys.stderr)
    sides = [("engine", engine, {}), ("engine, no KV reuse", engine, {"reuse_kv": False}), ("naive", naive, {})]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    for r in range(args.repeats):
        for name, fn, over in sides:
            tokens, secs = fn(table, dataclasses.replace(cfg, seed=r, **over), ctx)
            rates[name].append(tokens / secs)
            print(f"repeat {r}  {name:20s} {tokens:6d} tokens  {secs:7.1f} s  {tokens / secs:7.1f} tokens/s")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("median tokens/s: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
    print(f"ratio engine / naive = {med['engine'] / med['naive']:.2f}x   "
          f"(without KV reuse: {med['engine, no KV reuse'] / med['naive']:.2f}x)")


if __name__ == "__main__":
    main()
