"""Model-FLOPs utilisation of `grpo-step` and of rollout sampling, against a matmul peak
measured in the same process with the same thread count.

peak: best of several n x n fp32 matmuls (2 n^3 FLOPs each). N: the model's parameter count
(tied input embedding counted once, as the LM head whose matmul is real work; the embedding
lookup is not). MFU = 6 N tokens/s / peak for a training step (forward + backward; gradient
checkpointing recomputes the forward, so the hardware does ~8 N per token: the MFU below
counts only the useful 6 N), 2 N sampled tokens/s / peak for rollout (prefill and the
observation tokens are extra work the rate does not count, so this is a lower bound).

    .venv/bin/python bench/bench_mfu.py [--model smollm2] [--threads 1]
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
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_grpo  # noqa: E402
import bench_rollout  # noqa: E402


def matmul_peak(n: int, repeats: int) -> float:
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n ** 3 / best


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--matmul", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=192)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    import pyarrow as pa
    import torch

    from atomcli import models
    from atomcli.context import Context
    from atomcli.env import search_local
    from atomcli.stages import rollout
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-mfu-"))
    model_path = str(models.make_tiny_model(tmp / "tiny", hidden=128, layers=4)) if args.model == "tiny" \
        else models.resolve(args.model)
    ctx = Context(quiet=True)
    model, _ = ctx.model(model_path)
    n_params = sum(p.numel() for p in model.parameters())

    peak0 = matmul_peak(args.matmul, 5)
    # training step: atomcli's own update on a fixed batch (bench_grpo's), beta 0
    g = argparse.Namespace(batch=args.batch, group=args.batch, prompt_len=args.prompt_len,
                           completion_len=args.completion_len, model_path=model_path, lr=1e-5, beta=0.0,
                           micro_batch=args.batch, gradient_checkpointing=True, steps=args.steps, dump="")
    g.data = str(tmp / "batch.parquet")
    bench_grpo.make_batch(model_path, g, Path(g.data))
    step_s = statistics.median(bench_grpo.side_ours(g)["times"])
    train_tps = args.batch * (args.prompt_len + args.completion_len) / step_s
    # sampling: the rollout engine, one turn, G samples of one question
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench_rollout.CORPUS))
    search_local.build_index(str(tmp / "corpus.jsonl"), str(tmp / "idx.sqlite"))
    table = pa.table({"id": ["b0"], "question": [bench_rollout.QUESTIONS[0]], "golden_answers": [["x"]]})
    cfg = rollout.RolloutConfig(model=model_path, search=f"local:{tmp / 'idx.sqlite'}", group_size=args.group_size,
                                batch_size=args.group_size, max_new_tokens=args.max_new_tokens, max_turns=1, k=3,
                                date="2026-01-01", temperature=1.0)
    bench_rollout.engine(table, dataclasses.replace(cfg, max_new_tokens=2), ctx)  # warm-up
    rates = []
    for r in range(2):
        tokens, secs = bench_rollout.engine(table, dataclasses.replace(cfg, seed=r), ctx)
        rates.append(tokens / secs)
    sample_tps = statistics.median(rates)
    peak = max(peak0, matmul_peak(args.matmul, 5))  # again after: load may have changed
    print(f"model {args.model}: N = {n_params / 1e6:.1f} M parameters; torch threads {torch.get_num_threads()}")
    print(f"matmul peak ({args.matmul}^2 fp32): {peak / 1e9:.1f} GFLOP/s")
    print(f"grpo-step: batch {args.batch} x {args.prompt_len + args.completion_len} tokens, {step_s:.2f} s/step, "
          f"{train_tps:.0f} tokens/s, {6 * n_params * train_tps / 1e9:.1f} GFLOP/s, "
          f"MFU {100 * 6 * n_params * train_tps / peak:.1f}%")
    print(f"rollout: G={args.group_size} x {args.max_new_tokens} tokens, {sample_tps:.1f} sampled tokens/s, "
          f"{2 * n_params * sample_tps / 1e9:.2f} GFLOP/s, MFU {100 * 2 * n_params * sample_tps / peak:.1f}%")


if __name__ == "__main__":
    main()
