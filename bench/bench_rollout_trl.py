"""Sampling throughput: `atom rollout`'s engine against TRL `GRPOTrainer`'s own generation.

Both sides sample G completions for each of the same questions from the same model, with the
same system prompt and chat template, temperature 1, top-p 1 and token cap. TRL's side is
`GRPOTrainer._generate(prompts)` exactly as `_generate_and_score_completions` calls it (no vLLM:
one batched `model.generate`, prompts already repeated G times); the trainer is built once,
outside the timing. Ours is `rollout.run` with `--max-turns 1`, so no tool is called and the
work is the same single turn (TRL's plain generation has no multi-turn agent loop; its
tool-calling loop needs a chat template with tool support, which SmolLM2's lacks). Sides
alternate per repeat; throughput is sampled tokens per second; ratio of medians.

    .venv/bin/python bench/bench_rollout_trl.py --model smollm2 --questions 2 --group-size 4
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_rollout  # noqa: E402  (its corpus and questions)


def trl_side(model_path: str, questions: list[str], args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from atomcli.agent import format as agent_format
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    n = len(questions) * args.group_size
    config = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-trl-gen-"), per_device_train_batch_size=n,
                        num_generations=args.group_size, max_completion_length=args.max_new_tokens,
                        temperature=1.0, top_p=1.0, use_cpu=True, bf16=False, report_to="none",
                        save_strategy="no", disable_tqdm=True, seed=0)
    system = agent_format.system_prompt("2026-01-01")
    prompts = [[{"role": "system", "content": system}, {"role": "user", "content": agent_format.user_message(q)}]
               for q in questions for _ in range(args.group_size)]
    with contextlib.redirect_stdout(sys.stderr):
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_dict({"prompt": [prompts[0]] * n}),
                              processing_class=tok)

    def go() -> tuple[int, float]:
        t0 = time.perf_counter()
        out = trainer._generate(prompts)
        return sum(len(c) for c in out[1]), time.perf_counter() - t0
    return go


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny (random) or a checkpoint folder")
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    import pyarrow as pa
    import torch

    from atomcli import models
    from atomcli.context import Context
    from atomcli.env import search_local
    from atomcli.stages import rollout
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollout-trl-"))
    model_path = str(models.make_tiny_model(tmp / "tiny", hidden=128, layers=4)) if args.model == "tiny" \
        else models.resolve(args.model)
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench_rollout.CORPUS))
    search_local.build_index(str(tmp / "corpus.jsonl"), str(tmp / "idx.sqlite"))
    qs = [bench_rollout.QUESTIONS[i % len(bench_rollout.QUESTIONS)] for i in range(args.questions)]
    table = pa.table({"id": [f"b{i}" for i in range(len(qs))], "question": qs, "golden_answers": [["x"]] * len(qs)})
    ctx = Context(quiet=True)
    cfg = rollout.RolloutConfig(model=model_path, search=f"local:{tmp / 'idx.sqlite'}", group_size=args.group_size,
                                batch_size=len(qs) * args.group_size, max_new_tokens=args.max_new_tokens,
                                max_turns=1, k=3, date="2026-01-01", temperature=1.0, top_p=1.0)
    trl_go = trl_side(model_path, qs, args)
    trl_go()  # warm-up, both sides
    rollout.run(table, cfg, ctx)
    print(f"model {args.model}, {len(qs)} questions x G={args.group_size}, {args.max_new_tokens} tokens, "
          f"torch threads {torch.get_num_threads()}", file=sys.stderr)
    rates: dict[str, list[float]] = {"engine": [], "trl": []}
    for r in range(args.repeats):
        for side in (("engine", "trl") if r % 2 == 0 else ("trl", "engine")):
            if side == "trl":
                tokens, secs = trl_go()
            else:
                t0 = time.perf_counter()
                out = rollout.run(table, dataclasses.replace(cfg, seed=r), ctx)
                secs = time.perf_counter() - t0
                tokens = sum(sum(m) for m in out.column("loss_mask").to_pylist())
            rates[side].append(tokens / secs)
            print(f"repeat {r} {side:6s} {tokens:6d} tokens {secs:7.2f} s {tokens / secs:8.1f} tokens/s")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"median tokens/s: engine {med['engine']:.1f}, TRL _generate {med['trl']:.1f}; "
          f"ratio engine / TRL = {med['engine'] / med['trl']:.2f}x")


if __name__ == "__main__":
    main()
