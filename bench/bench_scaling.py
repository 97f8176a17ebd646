"""How rollout and grpo-step cost grows with group size, turns and sequence length.

A tiny random Llama (`models.make_tiny_model`, hidden 128, 4 layers, the demo tokenizer) so
the sweep takes minutes on CPU. A random policy never writes a valid tool call or answer, so
every trajectory runs exactly `max_turns` turns of about `max_new_tokens` tokens each, each turn
followed by the engine's "no action" observation: the work per trajectory is fixed by the
knobs, which is what a sweep needs. Sweeps (one knob varied, the others at their base value):

- rollout: group size G (1 question, G trajectories in one batch), turns, tokens per turn;
- grpo-step: group size (batch = G trajectories), completion length (one step, warm).

Prints a table (seconds, and seconds per unit of the knob relative to the smallest point:
1.0 everywhere = linear) and writes PNG plots to bench/plots/.

    .venv/bin/python bench/bench_scaling.py [--threads 1] [--quick]
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
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_grpo  # noqa: E402
import bench_rollout  # noqa: E402


def rollout_timer(model_path: str, tmp: Path):
    import pyarrow as pa

    from atomcli.context import Context
    from atomcli.env import search_local
    from atomcli.stages import rollout
    (tmp / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bench_rollout.CORPUS))
    search_local.build_index(str(tmp / "corpus.jsonl"), str(tmp / "idx.sqlite"))
    table = pa.table({"id": ["b0"], "question": [bench_rollout.QUESTIONS[0]], "golden_answers": [["x"]]})
    ctx = Context(quiet=True)
    base = rollout.RolloutConfig(model=model_path, search=f"local:{tmp / 'idx.sqlite'}", k=3, date="2026-01-01",
                                 temperature=1.0, max_context=65536)

    def run(repeats: int, **over) -> tuple[float, int]:
        cfg = dataclasses.replace(base, batch_size=max(16, over.get("group_size", base.group_size)), **over)
        times, tokens = [], 0
        for r in range(repeats):
            t0 = time.perf_counter()
            out = rollout.run(table, dataclasses.replace(cfg, seed=r), ctx)
            times.append(time.perf_counter() - t0)
            tokens = sum(len(c) for c in out.column("completion_ids").to_pylist())
        return statistics.median(times), tokens
    run(1, group_size=1, max_turns=1, max_new_tokens=2)  # warm-up
    return run


def grpo_timer(model_path: str, tmp: Path):
    def run(repeats: int, batch: int, completion_len: int, prompt_len: int = 128) -> tuple[float, int]:
        args = argparse.Namespace(batch=batch, group=batch, prompt_len=prompt_len, completion_len=completion_len,
                                  model_path=model_path, lr=1e-5, beta=0.0, micro_batch=min(batch, 4),
                                  gradient_checkpointing=True, steps=repeats, dump="")
        data = tmp / f"g{batch}_{completion_len}.parquet"
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            bench_grpo.make_batch(model_path, args, data)
        args.data = str(data)
        res = bench_grpo.side_ours(args)  # one warm-up step, then `repeats` timed steps
        return statistics.median(res["times"]), batch * (prompt_len + completion_len)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer points (a smoke run)")
    ap.add_argument("--plots", default=str(HERE / "plots"))
    args = ap.parse_args()
    import torch

    from atomcli import models
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    model_path = str(models.make_tiny_model(tmp / "tiny", hidden=128, layers=4))
    q = args.quick
    base = {"group_size": 4, "max_turns": 3, "max_new_tokens": 32}
    sweeps = {
        ("rollout", "group size"): ("group_size", [2, 4] if q else [2, 4, 8, 16]),
        ("rollout", "turns"): ("max_turns", [1, 2] if q else [1, 2, 4, 6, 10]),
        ("rollout", "tokens per turn"): ("max_new_tokens", [16, 32] if q else [16, 32, 64, 128]),
        ("grpo-step", "group size"): ("batch", [2, 4] if q else [2, 4, 8, 16]),
        ("grpo-step", "completion length"): ("completion_len", [128, 256] if q else [128, 256, 512, 1024]),
    }
    roll, grpo = rollout_timer(model_path, tmp), grpo_timer(model_path, tmp)
    results = []
    print(f"{'stage':>10} {'knob':>18} {'value':>6} {'seconds':>8} {'tokens':>7} {'s/unit vs first':>16}")
    for (stage, label), (knob, values) in sweeps.items():
        rows = []
        for v in values:
            if stage == "rollout":
                secs, tokens = roll(args.repeats, **{**base, knob: v})
            else:
                kw = {"batch": 8, "completion_len": 256, knob: v}
                secs, tokens = grpo(args.repeats, **kw)
            rows.append((v, secs, tokens))
        for v, secs, tokens in rows:
            rel = (secs / v) / (rows[0][1] / rows[0][0])
            print(f"{stage:>10} {label:>18} {v:>6} {secs:>8.3f} {tokens:>7} {rel:>16.2f}", flush=True)
        results.append((stage, label, rows))
    plot(results, Path(args.plots), args.threads)


def plot(results, out: Path, threads: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out.mkdir(parents=True, exist_ok=True)
    for stage in ("rollout", "grpo-step"):
        mine = [r for r in results if r[0] == stage]
        fig, axes = plt.subplots(1, len(mine), figsize=(4.2 * len(mine), 3.6))
        for ax, (_, label, rows) in zip(axes, mine):
            xs, ys = [r[0] for r in rows], [r[1] for r in rows]
            ax.plot(xs, ys, "o-", label="measured")
            ax.plot(xs, [ys[0] * x / xs[0] for x in xs], "--", color="gray", label="linear from first point")
            ax.set_xlabel(label)
            ax.set_ylabel("seconds")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.legend(fontsize=8)
        fig.suptitle(f"{stage} cost, tiny random model, CPU, {threads} thread(s)")
        fig.tight_layout()
        fig.savefig(out / f"scaling_{stage.replace('-', '_')}.png", dpi=100)
        plt.close(fig)


if __name__ == "__main__":
    main()
