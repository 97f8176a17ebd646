"""bf16 against fp32 on this machine's CPU, side by side in one run: SFT steps, a GRPO update and
greedy rollout decoding of the embedded SmolLM2, with the numeric drift bf16 brings.

Why: the CPU here has AMX (`lscpu`: amx_bf16), where a bf16 matmul runs several times faster than
an fp32 one; the learn preset's minutes are mostly matmuls (SFT, grpo-step) and decoding. bf16 here
is autocast (fp32 master weights and AdamW state, bf16 matmuls), as `--precision bf16` does on a GPU.

Each measurement is a fresh subprocess (its own torch threads and allocator), fp32 and bf16
alternating, `--repeats` times each; reported: median seconds, the ratio bf16 / fp32 (< 1: bf16
faster), and for GRPO the drift of the sampled tokens' log-probs (bf16 autocast vs fp32, mean and
max |Δ log p|) that an importance ratio computed under bf16 carries.

`--only decode` times a greedy rollout of the first `--decode-questions` test questions (an eval's
work) three ways: fp32, a bf16 copy of the weights (`bf16-weights`, what a sampling copy of the
policy refreshed after each update would be) and bf16 autocast over fp32 weights (`bf16`), and
says how many answers equal fp32's: on this CPU decoding is mostly small matmuls and attention over
a long KV cache, so the matmul speed-up of training need not carry over.

    # RUN: a run-all folder with an SFT and a GRPO step, e.g. the demo tour (`atom run-all --demo --out RUN`)
    .venv/bin/python bench/bench_precision.py --sft-data RUN/world/sft.parquet \\
        --rewarded RUN/steps/0001/rewarded.parquet --model RUN/sft
    .venv/bin/python bench/bench_precision.py --only decode --model RUN/sft \\
        --questions RUN/world/test.jsonl --index RUN/world/index.sqlite
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(kind: str, precision: str, args) -> dict:
    """One measurement in this process."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import pyarrow.parquet as pq

    from atomcli.context import Context
    ctx = Context(quiet=True)
    if kind == "sft":
        from atomcli.stages import sft
        table = pq.read_table(args.sft_data)
        cfg = sft.SFTConfig(model="smollm2", max_steps=args.sft_steps, lr=3e-4, batch_size=4, max_length=2048,
                            warmup_ratio=0.1, gradient_checkpointing=False, precision=precision)
        res = sft.run(table, cfg, ctx)
        return {"seconds": res.metrics["seconds"], "per_step": res.metrics["seconds_per_step"],
                "loss_last": res.metrics["train_loss_last"]}
    if kind == "grpo":
        from atomcli.stages import grpo_step
        table = pq.read_table(args.rewarded)
        cfg = grpo_step.GRPOConfig(model=args.model, lr=2e-5, beta=0.0, micro_batch=4,
                                   gradient_checkpointing=False, precision=precision,
                                   skip_zero_advantage=False)
        t0 = time.perf_counter()
        res = grpo_step.run(table, cfg, ctx)
        return {"seconds": time.perf_counter() - t0, "update_seconds": res.metrics["seconds"],
                "tokens": res.metrics["input_tokens"], "loss": res.metrics["loss"],
                "drift": logprob_drift(args.model, table) if precision == "bf16" else None}
    if kind == "decode":
        return decode(precision, args, ctx)
    raise SystemExit(f"unknown kind {kind}")


def decode(precision: str, args, ctx) -> dict:
    """A rollout of `--decode-questions` test questions with the policy in fp32, in a bf16 copy of its
    weights (`bf16-weights`: what a sampling copy would be) or under bf16 autocast (`bf16`)."""
    import contextlib

    import torch

    from atomcli import models, tableio
    from atomcli.stages import rollout
    questions = tableio.read_table(args.questions).slice(0, args.decode_questions)
    model, tok = models.load(args.model, dtype="bfloat16" if precision == "bf16-weights" else "float32")
    ctx.cached(("model", args.model, ()), lambda: (model, tok))  # the rollout's context.model(spec) gets this one
    cfg = rollout.RolloutConfig(model=args.model, search=f"local:{args.index}", group_size=args.decode_group,
                                max_turns=4, max_new_tokens=192, k=3, temperature=args.decode_temperature,
                                batch_size=32, date="2026-01-01", seed=0)
    auto = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    t0 = time.perf_counter()
    with auto:
        table = rollout.run(questions, cfg, ctx)
    seconds = time.perf_counter() - t0
    rows = table.to_pylist()
    tokens = sum(sum(r["loss_mask"]) for r in rows)
    return {"seconds": seconds, "tokens": tokens, "tok_per_s": tokens / seconds,
            "answers": [r["answer"] for r in rows], "searches": sum(r["n_search"] for r in rows) / len(rows)}


def logprob_drift(model_dir: str, table, rows: int = 8) -> dict:
    """|log p(bf16 autocast) - log p(fp32)| over the sampled tokens of the first `rows` rows."""
    import torch

    from atomcli import models
    model, _ = models.load(model_dir)
    model.eval()
    diffs = []
    for r in table.slice(0, rows).to_pylist():
        ids = torch.tensor([r["prompt_ids"] + r["completion_ids"]])
        n = len(r["prompt_ids"])
        out = {}
        for name, ctx in (("fp32", torch.autocast("cpu", enabled=False)),
                          ("bf16", torch.autocast("cpu", dtype=torch.bfloat16))):
            with torch.no_grad(), ctx:
                logits = model(ids).logits[0, n - 1:-1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, ids[0, n:, None])[:, 0]
            out[name] = lp
        mask = torch.tensor(r["loss_mask"], dtype=torch.bool)
        diffs.append((out["bf16"] - out["fp32"])[mask].abs())
    d = torch.cat(diffs)
    return {"mean_abs": float(d.mean()), "max_abs": float(d.max()), "tokens": int(d.numel())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft-data", default="", help="an SFT table (a run's world/sft.parquet): for `sft`")
    p.add_argument("--rewarded", default="", help="a rewarded table (a run's steps/NNNN/rewarded.parquet): for `grpo`")
    p.add_argument("--questions", default="", help="a question file (a run's world/test.jsonl): for `decode`")
    p.add_argument("--index", default="", help="the local index of --questions (world/index.sqlite): for `decode`")
    p.add_argument("--decode-questions", type=int, default=16)
    p.add_argument("--decode-group", type=int, default=1, help="samples per question (1: an eval)")
    p.add_argument("--decode-temperature", type=float, default=0.0)
    p.add_argument("--model", required=True, help="the checkpoint that rolled the table out")
    p.add_argument("--sft-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--only", choices=["sft", "grpo", "decode"], default=None,
                   help="one kind (default: sft and grpo; decode only when asked)")
    p.add_argument("--child", nargs=2, metavar=("KIND", "PRECISION"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(*args.child, args)), flush=True)
        return
    results: dict = {}
    kinds = [args.only] if args.only else ["sft", "grpo"]
    precisions = {"sft": ("fp32", "bf16"), "grpo": ("fp32", "bf16"), "decode": ("fp32", "bf16-weights", "bf16")}
    for kind in kinds:
        for rep in range(args.repeats):
            order = precisions[kind] if rep % 2 == 0 else precisions[kind][::-1]
            for precision in order:
                cmd = [sys.executable, __file__, "--child", kind, precision] + [
                    a for k, v in vars(args).items() if k not in ("child", "only", "repeats")
                    for a in (f"--{k.replace('_', '-')}", str(v))]
                out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
                if out.returncode or not line:
                    sys.exit(f"{kind}/{precision} failed:\n{out.stderr[-3000:]}")
                r = json.loads(line[0][7:])
                results.setdefault((kind, precision), []).append(r)
                shown = {k: v for k, v in r.items() if k != "answers"}
                print(kind, precision, json.dumps(shown), file=sys.stderr, flush=True)
    key = {"sft": "per_step", "grpo": "update_seconds", "decode": "seconds"}
    for kind in kinds:
        f = statistics.median(r[key[kind]] for r in results[(kind, "fp32")])
        for precision in precisions[kind][1:]:
            b = statistics.median(r[key[kind]] for r in results[(kind, precision)])
            print(f"{kind:6s} {key[kind]:15s} fp32 {f:8.1f} s   {precision:12s} {b:8.1f} s   "
                  f"{precision}/fp32 {b / f:.2f}")
    if "grpo" in kinds:
        d = results[("grpo", "bf16")][0]["drift"]
        print(f"grpo  bf16 log-prob drift over {d['tokens']} sampled tokens: mean |Δ| {d['mean_abs']:.4f}, "
              f"max {d['max_abs']:.3f}")
        print("grpo  loss fp32 " + ", ".join(f"{r['loss']:.5f}" for r in results[("grpo", "fp32")]) +
              "   bf16 " + ", ".join(f"{r['loss']:.5f}" for r in results[("grpo", "bf16")]))
    if "decode" in kinds:  # greedy: does the cheaper precision give the same answers?
        ref = results[("decode", "fp32")][0]
        for precision in precisions["decode"][1:]:
            r = results[("decode", precision)][0]
            same = sum(a == b for a, b in zip(ref["answers"], r["answers"]))
            print(f"decode {precision}: {same}/{len(ref['answers'])} answers equal to fp32's, searches/trajectory "
                  f"{r['searches']:.2f} (fp32 {ref['searches']:.2f}), tokens {r['tokens']} (fp32 {ref['tokens']})")


if __name__ == "__main__":
    main()
