"""Benchmark `atom grpo-step`'s update against TRL's `GRPOTrainer` training step.

Both sides train the same model on the same completions: a batch of B trajectories of fixed
prompt and completion lengths (real tokens: the agent's system prompt, then text), with a
masked span in the middle of each completion standing for a tool response (TRL: `tool_mask`,
atomcli: `loss_mask`) and group-relative advantages. Generation is excluded: TRL's
`_generate_and_score_completions` is replaced by a function that returns the precomputed
batch (plus reference log-probs from TRL's own `_get_per_token_logps_and_entropies` when
beta > 0, which is what the original does after generating). Same settings on both sides:
token-mean loss (TRL `loss_type="dapo"`), the same micro-batch and accumulation, AdamW at a
constant lr, grad-norm clip 1.0, gradient checkpointing as chosen, the reference model kept in
memory, CPU fp32.

Each measurement is a fresh subprocess (sides alternate, ours first on even repeats): it
sets up, runs one warm-up step (allocates the optimizer state), resets the peak-RSS counter
(/proc/self/clear_refs), then times `--steps` steps. Reported per side: median step time,
peak RSS during the steps above the RSS before them, and the absolute peak; then ratios
(atomcli / TRL, < 1 is better for atomcli). As a correctness check, the first step's loss and
the weights after it are compared between the two sides.

    .venv/bin/python bench/bench_grpo.py                 # tiny random model
    .venv/bin/python bench/bench_grpo.py --model smollm2 --batch 4 --prompt-len 128 --completion-len 256
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.norm.weight")


# --- memory probes (Linux) ------------------------------------------------------------------------

def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MB
    return float("nan")


def reset_peak() -> float:
    """Reset VmHWM to the current RSS; return the current RSS (MB)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status("VmRSS")


# --- the batch --------------------------------------------------------------------------------------

def make_batch(model_path: str, args, out: Path) -> None:
    """Write the shared batch (a trajectory table) with the model's own log-probs as old_logprobs."""
    import random

    import pyarrow as pa
    import torch

    from atomcli import models, schema, tableio
    from atomcli.agent import format as agent_format
    model, tok = models.load(model_path)
    rng = random.Random(0)
    sys_ids = tok(agent_format.system_prompt(date="2025-01-01"), add_special_tokens=False)["input_ids"]
    words = agent_format.DEFAULT_SYSTEM_PROMPT.split()[::-1]
    text_ids = tok(" ".join(words * (4 + args.completion_len // 100)), add_special_tokens=False)["input_ids"]
    rows = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "loss_mask", "old_logprobs", "advantage")}
    for i in range(args.batch):
        prompt = (sys_ids * (args.prompt_len // len(sys_ids) + 1))[:args.prompt_len]
        start = rng.randrange(0, len(text_ids) - args.completion_len)
        comp = text_ids[start:start + args.completion_len]
        # a tool response of varying length in the middle: rows train on different token counts,
        # so the token-mean loss is not zero even with zero-mean advantages and ratios of 1
        span = rng.randrange(args.completion_len // 6, args.completion_len // 2)
        first = (args.completion_len - span) // 2
        mask = [1] * first + [0] * span + [1] * (args.completion_len - span - first)
        rows["group_id"].append(f"g{i // args.group}")
        rows["prompt_ids"].append(prompt)
        rows["completion_ids"].append(comp)
        rows["loss_mask"].append(mask)
        rows["advantage"].append(0.0)
        rows["old_logprobs"].append([0.0] * len(comp))
    adv = [rng.gauss(0, 1) for _ in range(args.batch)]
    for g in range(0, args.batch, args.group):  # group-normalized, as aggregate-reward makes them
        grp = adv[g:g + args.group]
        m, s = statistics.mean(grp), statistics.pstdev(grp) + 1e-6
        rows["advantage"][g:g + args.group] = [(a - m) / s for a in grp]
    from atomcli.train.logprobs import sequence_logprobs
    with torch.no_grad():  # old_logprobs = the policy's own, as right after sampling
        for prompt, comp, mask, old in zip(*(rows[k] for k in ("prompt_ids", "completion_ids", "loss_mask",
                                                                "old_logprobs"))):
            js = [j for j, m in enumerate(mask) if m]
            ids = torch.tensor([prompt + comp])
            cols = torch.tensor([len(prompt) + j - 1 for j in js])
            lp = sequence_logprobs(model, ids, torch.ones_like(ids), torch.zeros_like(cols), cols,
                                   torch.tensor([comp[j] for j in js]))[0]
            for j, v in zip(js, lp.tolist()):
                old[j] = v
    table = pa.table({k: schema.array(k, v) for k, v in rows.items()})
    table = schema.with_provenance(table, "rollout", tokenizer=models.tokenizer_id(tok))
    tableio.write_table(table, str(out))


# --- the two sides (each runs in its own process) ---------------------------------------------------

def side_ours(args) -> dict:
    import torch

    from atomcli import models, tableio
    from atomcli.stages import grpo_step
    from atomcli.train import grpo
    table = tableio.read_table(args.data)
    cfg = grpo_step.GRPOConfig(model=args.model_path, lr=args.lr, beta=args.beta, micro_batch=args.micro_batch,
                               gradient_checkpointing=args.gradient_checkpointing, max_grad_norm=1.0)
    model, tok = models.load(args.model_path)
    ref = models.load(args.model_path)[0] if cfg.beta > 0 else None
    world = grpo.World()
    loss = grpo_step.loss_settings(cfg)
    mbs = grpo.micro_batches(grpo_step.read_batch(table), loss, world, torch.device("cpu"), tok.pad_token_id)
    grpo_step.prepare_for_training(model, cfg)
    optimizer = grpo.make_optimizer(model, cfg.lr, cfg.weight_decay)
    times, loss, base = [], None, None
    for step in range(1 + args.steps):
        t0 = time.perf_counter()
        if ref is not None:
            grpo.fill_ref_logprobs(ref, mbs, loss)
        m = grpo.grpo_update(model, optimizer, mbs, loss, world)
        dt = time.perf_counter() - t0
        if step == 0:
            loss = m["loss"]
            _dump(model, args.dump)
            base = reset_peak()
        else:
            times.append(dt)
    return {"times": times, "base_rss": base, "peak_rss": _status("VmHWM"), "loss": loss}


def side_trl(args) -> dict:
    import types

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from atomcli import tableio
    table = tableio.read_table(args.data)
    prompt = torch.tensor(table.column("prompt_ids").to_pylist())
    comp = torch.tensor(table.column("completion_ids").to_pylist())
    tool_mask = torch.tensor(table.column("loss_mask").to_pylist())
    adv = torch.tensor(table.column("advantage").to_pylist(), dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(args.model_path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model_path)
    out_dir = tempfile.mkdtemp(prefix="bench-trl-")
    b = prompt.shape[0]
    config = GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=b // args.micro_batch, num_generations=args.group, max_steps=1 + args.steps,
        learning_rate=args.lr, lr_scheduler_type="constant", beta=args.beta, epsilon=0.2, loss_type="dapo",
        max_grad_norm=1.0, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
        disable_tqdm=True, gradient_checkpointing=args.gradient_checkpointing, seed=0,
        max_completion_length=comp.shape[1])

    def generate_and_score(self, inputs):
        # what the original returns after generation and rewards, for our fixed batch
        ones = torch.ones_like(comp)
        out = {"prompt_ids": prompt.clone(), "prompt_mask": torch.ones_like(prompt), "completion_ids": comp.clone(),
               "completion_mask": ones, "tool_mask": tool_mask.clone(), "advantages": adv.clone(),
               "num_items_in_batch": tool_mask.sum()}
        if self.beta != 0.0:
            with torch.no_grad():
                out["ref_per_token_logps"] = self._get_per_token_logps_and_entropies(
                    self.ref_model, torch.cat([prompt, comp], 1), torch.ones(b, prompt.shape[1] + comp.shape[1],
                                                                                dtype=torch.long),
                    comp.shape[1], batch_size=args.micro_batch)[0]
        return out

    state = {"t0": None, "times": [], "loss": None, "base": None}

    class Timer(TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            state["t0"] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            dt = time.perf_counter() - state["t0"]
            if s.global_step == 1:
                _dump(kw["model"], args.dump)
                state["base"] = reset_peak()
            else:
                state["times"].append(dt)

        def on_log(self, a, s, c, logs=None, **kw):
            if logs and "loss" in logs and state["loss"] is None:
                state["loss"] = float(logs["loss"])

    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=config, train_dataset=Dataset.from_dict({"prompt": ["q"] * 64}),
                          processing_class=tok, callbacks=[Timer()])
    trainer._generate_and_score_completions = types.MethodType(generate_and_score, trainer)
    import contextlib
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    return {"times": state["times"], "base_rss": state["base"], "peak_rss": _status("VmHWM"), "loss": state["loss"]}


def _dump(model, path):
    if path:
        import torch
        sd = model.state_dict()
        torch.save({k: sd[k].detach().clone() for k in KEEP if k in sd}, path)


# --- driver ---------------------------------------------------------------------------------------

def worker(args) -> None:
    import torch
    torch.manual_seed(0)
    res = side_ours(args) if args.side == "ours" else side_trl(args)
    print(json.dumps(res))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="tiny (random, demo tokenizer), smollm2, or a checkpoint folder")
    p.add_argument("--batch", type=int, default=8, help="trajectories per step (B)")
    p.add_argument("--group", type=int, default=4, help="group size (must divide B)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--completion-len", type=int, default=384)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side, alternating")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.001)
    p.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false")
    p.add_argument("--threads", type=int, default=0, help="OMP threads per run (0 = torch default)")
    p.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--model-path", help=argparse.SUPPRESS)
    p.add_argument("--dump", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.side:
        return worker(args)
    if args.batch % args.group or args.batch % args.micro_batch:
        p.error("--group and --micro-batch must divide --batch")

    from atomcli import models
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpo-"))
    model_path = str(models.make_tiny_model(tmp / "tiny", hidden=128, layers=4)) if args.model == "tiny" \
        else models.resolve(args.model)
    data = tmp / "batch.parquet"
    make_batch(model_path, args, data)
    print(f"model {args.model} ({model_path}); batch {args.batch} x ({args.prompt_len} prompt + "
          f"{args.completion_len} completion) tokens, micro-batch {args.micro_batch}, beta {args.beta}, "
          f"gradient checkpointing {args.gradient_checkpointing}", file=sys.stderr)

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    results = {"ours": [], "trl": []}
    base = [sys.executable, __file__, "--data", str(data), "--model-path", model_path,
            "--batch", str(args.batch), "--group", str(args.group), "--micro-batch", str(args.micro_batch),
            "--steps", str(args.steps), "--lr", str(args.lr), "--beta", str(args.beta)]
    if not args.gradient_checkpointing:
        base.append("--no-gradient-checkpointing")
    for r in range(args.repeats):
        for side in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
            dump = str(tmp / f"{side}.pt") if r == 0 else ""
            proc = subprocess.run(base + ["--side", side, "--dump", dump], capture_output=True, env=env, cwd=ROOT)
            if proc.returncode:
                sys.exit(f"{side} run failed:\n{proc.stderr.decode()[-3000:]}")
            res = json.loads(proc.stdout.decode().strip().splitlines()[-1])
            results[side].append(res)
            print(f"repeat {r} {side:4s}: step {statistics.median(res['times']):7.3f} s, "
                  f"peak +{res['peak_rss'] - res['base_rss']:7.1f} MB (abs {res['peak_rss']:.0f} MB), "
                  f"first loss {res['loss']:.6f}", file=sys.stderr)
    report(results, tmp, args.lr)


def report(results: dict, tmp: Path, lr: float) -> None:
    import torch
    med = lambda xs: statistics.median(xs)  # noqa: E731
    rows = {}
    for side, runs in results.items():
        rows[side] = {"step_s": med([med(r["times"]) for r in runs]),
                      "peak_extra_mb": med([r["peak_rss"] - r["base_rss"] for r in runs]),
                      "peak_abs_mb": med([r["peak_rss"] for r in runs]),
                      "loss": runs[0]["loss"]}
    print(f"{'':8s} {'step s':>10s} {'peak+ MB':>10s} {'peak MB':>10s} {'loss@1':>12s}")
    for side, label in (("ours", "atomcli"), ("trl", "TRL")):
        r = rows[side]
        print(f"{label:8s} {r['step_s']:10.3f} {r['peak_extra_mb']:10.1f} {r['peak_abs_mb']:10.0f} {r['loss']:12.6g}")
    o, t = rows["ours"], rows["trl"]
    print(f"ratio atomcli/TRL: time {o['step_s'] / t['step_s']:.2f}x, peak during step "
          f"{o['peak_extra_mb'] / max(t['peak_extra_mb'], 1e-9):.2f}x, "
          f"absolute peak {o['peak_abs_mb'] / t['peak_abs_mb']:.2f}x")
    a, b = torch.load(tmp / "ours.pt"), torch.load(tmp / "trl.pt")
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"check: first-step loss |diff| {abs(o['loss'] - t['loss']):.2e}; weights after it max |diff| {diff:.2e} "
          f"({diff / lr:.3f} x lr; AdamW's first update is about lr per weight)")


if __name__ == "__main__":
    main()
