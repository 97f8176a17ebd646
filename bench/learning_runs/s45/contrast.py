"""A trial arm for issue 20 (session 45): GRPO on the rejection-sampling rounds' own samples, right answers against
wrong ones to the same question, instead of (or after) fine-tuning on the right ones alone.

Why. `atom rft` keeps only the answers with F1 = 1 and fine-tunes on them, so the policy never sees which of its
answers to a question was wrong. On the transfer split it quotes the sentence that holds the answer and picks the
wrong span in 17-20 of 115 questions (session 44, positions.txt); its own right answers are mostly the easy
sentence-1 pattern and do not teach that. Round 1 of session 43 sampled two answers to each of 484 questions: 101
questions got one right and one wrong answer. GRPO with the outcome reward (`aggregate-reward --process none`) gives
such a pair advantages +1 and -1, and the loss over the two trajectories cancels on the tokens they share (the same
context, the same token, opposite signs), so what is trained is where they part: usually the last turn's quote and
answer. The clipped ratio (against the sampler's own log-probs, `old_logprobs`) is the trust region.

What it runs, in one process with the policy kept in memory between updates (as run-all does, atomcli.train.resident):
`aggregate-reward --process none` on each rollouts table; the rows of groups whose advantage is not 0, in groups kept
together and shuffled (seeded); then one `grpo-step` update per minibatch of `--groups` groups, continuing AdamW
from update to update; the last checkpoint is saved to OUT/ckpt. Per update metrics go to OUT/updates.jsonl.
Evaluate OUT/ckpt with `atom eval` as run-all does (contrast.sh).

    python bench/learning_runs/s45/contrast.py --rollouts runs/s43/real/rft/01/rollouts.parquet \
        --model runs/s43/real/sft --out runs/s46/contrast --lr 2e-5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def rewarded(paths: list[str], out: Path, ctx):
    """Each rollouts table through aggregate-reward --process none (groups are per table), concatenated."""
    import pyarrow as pa

    from atomcli import config as cfgmod, envelope, tableio
    from atomcli.stages import aggregate_reward
    cfg = cfgmod.build(aggregate_reward.AggregateConfig, {"process": "none"}, source="contrast")
    tables = []
    for k, path in enumerate(paths):
        dest = out / f"rewarded_{k + 1:02d}.parquet"
        if not dest.exists():
            envelope.table_to_table("aggregate-reward", aggregate_reward, cfg, path, str(dest), ctx)
        t = tableio.read_table(str(dest))
        # group ids are per table: prefix them so that two rounds' groups of one question stay apart
        gid = [f"r{k + 1}:{g}" for g in t.column("group_id").to_pylist()]
        tables.append(t.set_column(t.column_names.index("group_id"), "group_id", pa.array(gid)))
    return pa.concat_tables(tables, promote_options="default")


def last_turn_only(table):
    """`turn_advantages` that give each row's advantage to its last assistant turn only (0 to the turns before it):
    the turn that quotes and answers. Two samples to one question part from their first words (sampled thoughts), so
    a trajectory-wide advantage also pushes on wordings that differ by chance; this keeps the push on the reading."""
    import pyarrow as pa

    from atomcli.agent.episode import turn_spans
    turns = [len(turn_spans(m)) for m in table.column("loss_mask").to_pylist()]
    values = [[0.0] * (n - 1) + [float(a)] if n else None
              for n, a in zip(turns, table.column("advantage").to_pylist())]
    col = pa.array(values, type=pa.list_(pa.float64()))
    if "turn_advantages" in table.column_names:
        return table.set_column(table.column_names.index("turn_advantages"), "turn_advantages", col)
    return table.append_column("turn_advantages", col)


def minibatches(table, groups_per_batch: int, seed: int) -> list[list[int]]:
    """Row indices of each minibatch: the groups with a non-zero advantage, whole, in a seeded order."""
    adv, gid = table.column("advantage").to_pylist(), table.column("group_id").to_pylist()
    by_group: dict[str, list[int]] = {}
    for i, (a, g) in enumerate(zip(adv, gid)):
        by_group.setdefault(g, []).append(i)
    live = sorted(g for g, rows in by_group.items() if any(adv[i] != 0 for i in rows))
    random.Random(seed).shuffle(live)
    return [[i for g in live[s:s + groups_per_batch] for i in by_group[g]]
            for s in range(0, len(live), groups_per_batch)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", action="append", required=True, help="a round's rollouts.parquet (repeatable)")
    ap.add_argument("--model", required=True, help="the checkpoint that sampled them (the SFT, for round 1)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--groups", type=int, default=2, help="groups (questions) per update")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the groups")
    ap.add_argument("--clip-eps", type=float, default=0.2)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--last-turn", action="store_true", help="train the last assistant turn only (last_turn_only)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.groups < 1 or a.epochs < 1:
        ap.error("--groups and --epochs must be at least 1")

    from atomcli import checkpoint, config as cfgmod, envelope, tableio
    from atomcli.context import Context
    from atomcli.stages import grpo_step
    from atomcli.train.resident import after_update

    out = Path(a.out)
    if (out / "ckpt" / "config.json").exists():
        sys.exit(f"{out}/ckpt exists")
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context()
    table = rewarded(a.rollouts, out, ctx)
    if a.last_turn:
        table = last_turn_only(table)
    batches = [b for e in range(a.epochs) for b in minibatches(table, a.groups, a.seed + e)]
    n_rows = sum(len(b) for b in batches) // a.epochs
    ctx.log(f"contrast: {table.num_rows} rows, {n_rows} in groups with a non-zero advantage; "
            f"{len(batches)} updates of {a.groups} groups, lr {a.lr}{', last turn only' if a.last_turn else ''}")
    base = cfgmod.build(grpo_step.GRPOConfig, {"lr": a.lr, "beta": 0.0, "clip_eps": a.clip_eps,
                                                "clip_eps_high": a.clip_eps, "precision": a.precision,
                                                "gradient_checkpointing": False, "micro_batch": 2,
                                                "seed": a.seed}, source="contrast")
    model, log = a.model, (out / "updates.jsonl").open("w")
    t0 = time.perf_counter()
    for k, rows in enumerate(batches, 1):
        chunk, dest = out / "batch.parquet", out / "steps" / f"{k:04d}"
        tableio.write_table(table.take(rows), str(chunk))
        cfg = dataclasses.replace(base, model=model)
        result = envelope.train_from_table("grpo-step", grpo_step, cfg, str(chunk), str(dest), ctx)
        ctx.resident = after_update(ctx.resident, model, str(dest), result, cfg)
        model = str(dest)
        m = {"update": k, "rows": len(rows), "elapsed_s": round(time.perf_counter() - t0, 1),
             **{key: v for key, v in result.metrics.items() if isinstance(v, (int, float))}}
        log.write(json.dumps(m) + "\n")
        log.flush()
    checkpoint.save(result, str(out / "ckpt"), stage="grpo-step", config=cfg, context=ctx, state=ctx.resident.state)
    (out / "batch.parquet").unlink(missing_ok=True)
    ctx.log(f"contrast: {len(batches)} updates in {(time.perf_counter() - t0) / 60:.1f} min -> {out / 'ckpt'}")


if __name__ == "__main__":
    main()
