"""One run folder at work: its stage configs, and the calls that run a stage into it (skipping outputs that exist).

Every stage runs through the same functions as its single command (atomcli.envelope, rollout_io), so each
table under the run folder equals the one the piped chain makes with the same seeds. Evals are cached as
eval/<name>.json and compared with the first eval of their split.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from atomcli.stages.run_all import config, layout


class Run:
    """One run folder: paths, stage configs (cfg, sft, rollout, score, aggregate, ig, rft, grpo, eval),
    the served policy's follower, and the shared context."""

    def __init__(self, out: Path, settings: dict, context):
        self.out, self.ctx = out, context
        for name, value in config.load(settings, context, out).items():
            setattr(self, name, value)
        # per split ("" = the test, "transfer", "dev"): the first eval, which every later one is compared with
        self.first: dict[str, tuple[str, dict]] = {}
        self.t0 = time.time()
        self.step_times: list[float] = []  # durations of the steps this process ran, for the ETA
        self.step_start: float | None = None
        self.candidates: list[tuple[str, str]] = []  # (eval name, checkpoint) with a dev eval, in order

    def log(self, msg: str):
        el = time.time() - self.t0
        self.ctx.log(f"[dim]{el / 60:5.1f} min[/] {msg}")

    def step_dir(self, t: int) -> Path:
        return self.out / layout.STEPS / f"{t + 1:04d}"

    def read(self, path: Path, stage: str | None = None):
        from atomcli import envelope, tableio
        return envelope.read_input(str(path), stage) if stage else tableio.read_table(str(path))

    def table_stage(self, stage: str, mod, cfg, inp: Path, out: Path):
        """Read, run and write one table stage, skipping it when its output exists (resume)."""
        from atomcli import envelope
        if out.exists():
            return
        self.log(f"{stage} -> {out.relative_to(self.out)}")
        envelope.table_to_table(stage, mod, cfg, str(inp), str(out), self.ctx)

    def rollout_stage(self, cfg, inp: Path, out: Path):
        from atomcli import heap
        from atomcli.stages import rollout, rollout_io
        if out.exists():
            return
        if self.follow is not None:  # the server is made to serve this checkpoint first
            cfg = self.follow.rollout_config(cfg)
        self.log(f"rollout ({cfg.model}) -> {out.relative_to(self.out)}")
        table = self.read(inp, "rollout")
        with heap.unbounded():  # no trims for the kept heap's bound while sampling (atomcli/heap.py says why)
            rollout_io.run_to_file(rollout, table, cfg, self.ctx, out=str(out), fmt=None, resume=True)

    def train_stage(self, stage: str, mod, cfg, inp: Path, out: Path):
        """Train a checkpoint in a child process (atomcli/stages/run_all/child.py says why) and adopt its heap
        ceiling for the sampling that follows."""
        from atomcli import heap
        from atomcli.stages.run_all import child
        if (out / "config.json").exists():
            return
        self.log(f"{stage} ({cfg.model}) -> {out.relative_to(self.out)}")
        self.ctx.forget_models()  # the child needs the memory; the sampling after it loads the new checkpoint
        self.release_heap()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # and the GPU memory this process's caching allocator still holds
        got = child.train(stage, mod, cfg, inp, out, self.ctx)
        if got["ceiling"]:
            heap.set_ceiling(got["ceiling"])
        self.log(f"{stage} trained in a child process (its heap guard trimmed {got['trims']} times: "
                 f"{got['bound_trims']} for its bound, {got['ceiling_trims']} for its ceiling; resident at its peak "
                 f"{got['peak_mb'] or 0:,.0f} MB, at its end {got['resident_mb'] or 0:,.0f} MB; this process "
                 f"{heap.resident_mb() or 0:,.0f} MB)")

    def release_heap(self) -> None:
        """Hand the heap's free pages back (heap.release) around each training stage: the sampling before it leaves
        holes sized for KV caches, which a training child does not need the parent to keep, and an in-process
        grpo-step leaves holes sized for activations, which the sampling after it does not need."""
        from atomcli import heap
        heap.release()

    def grpo_stage(self, t: int, cfg, inp: Path, out: Path) -> dict:
        """grpo-step on the resident policy (atomcli.train.resident): it continues in memory, and its
        checkpoint is written every `save_every` steps and at the last. Returns the update's metrics
        (as metrics.json holds them); a saved checkpoint is not redone."""
        from atomcli import checkpoint, envelope, schema
        from atomcli.stages import grpo_step
        from atomcli.train.resident import after_update
        if (out / "config.json").exists():
            return json.loads((out / checkpoint.METRICS_FILE).read_text())
        # with a dev split every eval point may become the final checkpoint: it is kept on disk
        save = (t + 1) % self.save_every == 0 or t + 1 == self.cfg.steps or \
            bool(self.cfg.dev_questions and self.is_eval_point(t))
        self.log(f"grpo-step ({cfg.model}) -> {out.relative_to(self.out)}{'' if save else ' (in memory)'}")
        self.release_heap()
        result = envelope.train_from_table("grpo-step", grpo_step, cfg, str(inp), str(out), self.ctx)
        self.ctx.resident = after_update(self.ctx.resident, cfg.model, str(out), result, cfg)
        if save:
            checkpoint.save(result, str(out), stage="grpo-step", config=cfg, context=self.ctx,
                            state=self.ctx.resident.state)
        self.ctx.forget_models()  # models loaded from disk (the SFT checkpoint's sampler) are not needed again
        self.release_heap()
        return json.loads(json.dumps(schema._jsonable(result.metrics)))

    def evaluate(self, name: str, model: str, *, split: str = "") -> dict:
        """Greedy rollout of the split's questions, then scores; cached as eval/[split/]<name>.json.

        split: "transfer" (the second test set, eval/transfer/) or "dev" (the held-out training
        questions, eval/dev/), each compared with its own first eval."""
        from atomcli import tableio
        from atomcli.stages import evaluate
        transfer = split == layout.TRANSFER
        folder = self.out / layout.EVAL / split
        report_path = folder / f"{name}.json"
        first = self.first.get(split)
        if report_path.exists():
            report = json.loads(report_path.read_text())
            self.first.setdefault(split, (name, report))
            return report
        questions = folder / "questions.parquet"
        ecfg = dataclasses.replace(self.eval, model=model,
                                   search=self.cfg.transfer_search if transfer else self.eval.search)
        table_path = folder / f"{name}.parquet"
        self.rollout_stage(evaluate.rollout_config(ecfg), questions, table_path)
        # the eval stage's own report, from the same rollout settings `atom eval` uses
        report = evaluate.finish_report(self.read(table_path), ecfg, self.ctx, rolled_out=True)
        report.update({"name": name, "model": model})
        vs = ""
        if first is not None and "per_question" in first[1]:
            from atomcli.stages import compare
            report["compare"] = compare.compare_reports(report, first[1], baseline_name=first[0], seed=self.cfg.seed)
            vs = f"  (vs {first[0]}: ΔF1 {compare.describe(report['compare']['overall']['f1'])})"
        tableio.write_bytes_atomic(report_path, json.dumps(report, indent=2).encode())
        self.first.setdefault(split, (name, report))
        self.log(f"eval {split + ' ' if split else ''}{name}: F1 {report['overall']['f1']:.3f}  "
                 f"EM {report['overall']['em']:.3f}{vs}")
        return report

    def evaluate_transfer(self, name: str, model: str) -> dict | None:
        return self.evaluate(name, model, split=layout.TRANSFER) if self.cfg.transfer_test else None

    def eval_point(self, name: str, model: str) -> None:
        """The test eval of a checkpoint, and its dev eval when the run holds out a dev split
        (a candidate for the final checkpoint)."""
        self.evaluate(name, model)
        if self.cfg.dev_questions:
            self.evaluate(name, model, split=layout.DEV)
            self.candidates.append((name, model))

    def is_eval_point(self, t: int) -> bool:
        """Step t (0-based) is evaluated: every eval_every steps and the last."""
        return t + 1 == self.cfg.steps or bool(self.cfg.eval_every and (t + 1) % self.cfg.eval_every == 0)
