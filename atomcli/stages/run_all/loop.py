"""run-all's GRPO loop: N steps of rollout -> score-rrm (or score-ig) -> aggregate-reward -> grpo-step.

The policy, its AdamW state and the KL reference stay in memory from step to step (atomcli.train.resident);
each step's tables are written every step, its checkpoint every `save_every` steps and at the last. With
dynamic sampling a step rolls out reserve questions until enough groups carry signal. Also here: the
per-step metrics line and, with a dev split, the choice of the final checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from atomcli.stages.run_all import layout
from atomcli.stages.run_all.folder import resume_point


def steps(run, train, plan: list[list[int]], model: str, start: str) -> str:
    """The GRPO steps from checkpoint `model` (KL reference `start` unless [grpo-step] ref is set), with the eval
    points between them; returns the last step's checkpoint (`model` when there are no steps)."""
    cfg = run.cfg
    last = resume_point(run, run.log)
    for t in range(cfg.steps):
        d = run.step_dir(t)
        ckpt = d / "ckpt"
        if t + 1 > last or (t + 1 == last and not (d / "metrics.json").exists()):
            run.log(f"[bold]step {t + 1}/{cfg.steps}[/]{_eta(run, t, cfg.steps)}")
            q = cfg.questions_per_step
            picks = list(dict.fromkeys(plan[t]))  # a small pool can wrap: never one question twice a step
            first = sample_round(run, t, d, model, train.take(picks[:q]))
            batch, counts = first, None
            if cfg.dynamic_sampling:
                batch, counts = dynamic_batch(run, t, d, model, train, picks, first)
            ckpt_metrics = run.grpo_stage(t, dataclasses.replace(run.grpo, model=model, ref=run.grpo.ref or start),
                                          batch, ckpt)
            # diagnostics of the first round: what the policy did on the step's questions, comparable
            # with runs without dynamic sampling (the kept groups alone would hide the flat ones)
            log_metrics(run, t, d, first, counts, ckpt_metrics)
        model = str(ckpt)
        if run.is_eval_point(t) and t + 1 < cfg.steps:
            name = f"step-{t + 1:04d}"
            lost = not (ckpt / "config.json").exists() and not (run.out / layout.EVAL / f"{name}.json").exists()
            if t + 1 < last and lost:
                run.log(f"[yellow]note:[/] eval {name} is missing and its checkpoint was not saved: skipped")
            else:
                run.eval_point(name, model)  # between saves: the in-memory policy
    if cfg.steps:
        run.eval_point(f"step-{cfg.steps:04d}", model)
        if not run.candidates:  # with a dev split the final checkpoint may be another: only its transfer is run
            run.evaluate_transfer(f"step-{cfg.steps:04d}", model)
    return model


def sample_round(run, t: int, folder: Path, model: str, questions) -> Path:
    """rollout -> score -> aggregate-reward for one set of questions in `folder`; the rewarded table."""
    from atomcli import tableio
    from atomcli.stages import aggregate_reward, score_ig, score_rrm
    if not (folder / "questions.parquet").exists():
        tableio.write_table(questions, str(folder / "questions.parquet"))
    run.rollout_stage(dataclasses.replace(run.rollout, model=model, seed=run.cfg.seed + t),
                      folder / "questions.parquet", folder / "rollouts.parquet")
    if run.aggregate.process == "ig":  # information gain under the policy that made the rollouts
        run.table_stage("score-ig", score_ig, dataclasses.replace(run.ig, model=run.ig.model or model),
                        folder / "rollouts.parquet", folder / "scored.parquet")
    else:
        run.table_stage("score-rrm", score_rrm, run.score, folder / "rollouts.parquet", folder / "scored.parquet")
    run.table_stage("aggregate-reward", aggregate_reward,
                    dataclasses.replace(run.aggregate, step=t, total_steps=run.cfg.steps),
                    folder / "scored.parquet", folder / "rewarded.parquet")
    return folder / "rewarded.parquet"


def groups_with_signal(table) -> list:
    """Group ids, in order, with at least one nonzero advantage (or turn advantage): the groups a
    GRPO update learns from; the others contribute nothing to the gradient."""
    adv = table.column("advantage").to_pylist()
    turn = table.column("turn_advantages").to_pylist() if "turn_advantages" in table.column_names else None
    out: list = []
    for i, g in enumerate(table.column("group_id").to_pylist()):
        if g not in out and (adv[i] != 0 or (turn is not None and any(x != 0 for x in turn[i] or []))):
            out.append(g)
    return out


def dynamic_batch(run, t: int, d: Path, model: str, train, picks: list[int], first: Path, sample=None):
    """DAPO's dynamic sampling: roll out more of the step's reserve questions until `questions_per_step`
    groups have signal (or the rounds run out); the kept groups are written to selected.parquet.
    Returns (the table to train on, (groups rolled out, groups kept)). `sample`: the round function
    (sample_round; a test passes its own)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from atomcli import tableio
    sample = sample or sample_round
    out = d / "selected.parquet"
    q, rounds = run.cfg.questions_per_step, [first]
    while True:  # every round is resumable: a rerun re-reads the rounds it finds
        tables = [run.read(p) for p in rounds]
        kept = [(r, g) for r, tb in enumerate(tables) for g in groups_with_signal(tb)]  # (round, group):
        # two rounds may reuse a group id (a question id repeated in the train file)
        r = len(rounds)
        more = picks[r * q:(r + 1) * q]
        if len(kept) >= q or r > run.cfg.dynamic_sampling or not more:
            break
        run.log(f"dynamic sampling: {len(kept)} of {q} groups with signal; round {r + 1}")
        folder = d / f"round-{r + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        rounds.append(sample(run, t, folder, model, train.take(more)))
    sampled = sum(len(set(tb.column("group_id").to_pylist())) for tb in tables)
    keep = kept[:q]
    if not keep:  # nothing has signal: train on the first round (every row is skipped or zero)
        return first, (sampled, 0)
    if not out.exists():
        parts = [tb.filter(pc.is_in(tb.column("group_id"), pa.array([g for r, g in keep if r == k],
                                                                     type=tb.schema.field("group_id").type)))
                 for k, tb in enumerate(tables)]
        tableio.write_table(pa.concat_tables(parts, promote_options="default"), str(out))
    return out, (sampled, len(keep))


def choose_final(run) -> tuple[str, str]:
    """The eval point with the best dev F1 (ties: the later) is the run's final checkpoint; written
    to final.json with every candidate's dev and test F1. Returns (eval name, checkpoint)."""
    from atomcli import tableio
    scored = []
    for name, model in run.candidates:
        dev = json.loads((run.out / layout.EVAL / layout.DEV / f"{name}.json").read_text())
        test = json.loads((run.out / layout.EVAL / f"{name}.json").read_text())
        scored.append({"name": name, "checkpoint": model, "dev_f1": dev["overall"]["f1"],
                       "test_f1": test["overall"]["f1"]})
    best = max(reversed(range(len(scored))), key=lambda i: scored[i]["dev_f1"])  # reversed: ties -> later
    final = {**scored[best], "rule": "best dev F1 over the eval points (ties: the later)",
             "dev_questions": run.cfg.dev_questions, "candidates": scored}
    tableio.write_bytes_atomic(run.out / layout.FINAL_FILE, json.dumps(final, indent=2).encode())
    run.log(f"final checkpoint: {final['name']} (dev F1 {final['dev_f1']:.3f}; test F1 {final['test_f1']:.3f})")
    return final["name"], final["checkpoint"]


def _eta(run, t: int, steps: int) -> str:
    """Remaining time from the mean duration of the steps this process has finished."""
    now = time.time()
    if run.step_start is not None:
        run.step_times.append(now - run.step_start)
    run.step_start = now
    done = run.step_times
    if not done:
        return ""
    return f"  (ETA {sum(done) / len(done) * (steps - t) / 60:.1f} min + final eval)"


def log_metrics(run, t: int, d: Path, first: Path, counts: tuple[int, int] | None = None,
                ckpt_metrics: dict | None = None) -> None:
    """One line of metrics.jsonl per step, from the step's (first) rewarded table and the update's
    metrics (`counts`: groups rolled out and kept, with dynamic sampling)."""
    from atomcli import tableio
    from atomcli.stages.run_all import step_metrics as sm
    rewarded = run.read(first).to_pydict()
    ckpt_metrics = ckpt_metrics or {}
    line = sm.step_line(t + 1, rewarded, ckpt_metrics)
    if counts is not None:
        line[sm.SAMPLED_GROUPS], line[sm.KEPT_GROUPS] = counts
    line[sm.TIME_MIN] = (time.time() - run.t0) / 60
    tableio.write_bytes_atomic(d / "metrics.json", json.dumps(line).encode())
    # metrics.jsonl is rebuilt from the step folders, so a kill between writes never loses a line
    lines = [json.loads(p.read_text()) for p in sorted((run.out / layout.STEPS).glob("*/metrics.json"))]
    tableio.write_bytes_atomic(run.out / layout.METRICS, b"".join(json.dumps(x).encode() + b"\n" for x in lines))
    fmt = lambda k: "-" if line.get(k) is None else f"{line[k]:.3f}"  # noqa: E731
    run.log(f"step {t + 1}: reward {fmt(sm.REWARD_MEAN)} ± {fmt(sm.REWARD_STD)}  f1 {fmt(sm.F1)}  "
            f"atr {fmt(sm.ATR)}  alpha {fmt(sm.ALPHA)}  zero-var groups {fmt(sm.ZERO_VAR_GROUPS)}  "
            f"kl {fmt(sm.KL)}  entropy {fmt(sm.ENTROPY)}  grad {fmt(sm.GRAD_NORM)}")
