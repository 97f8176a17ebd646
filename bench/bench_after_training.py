"""Side by side: the same rollout in a fresh process, after an SFT in the same process, and after an SFT in a child.

What run-all does between its stages, in three arms, one after another (never two at once: two cores):

  fresh     the rollout alone in a new process
  inproc    an SFT of --sft-steps steps in the process, its heap handed back (heap.release), then the rollout
            (run-all before e70dda6)
  child     the same SFT in a child process (atomcli/stages/run_all/child.py), then the rollout (run-all since)

Every arm keeps the heap as run-all does (ATOM_HEAP=retain), samples with the bound lifted (heap.unbounded) and
under the SFT's memory check's ceiling. The SFT's checkpoint is thrown away: every arm samples --model, so the
tokens are the same and only the process's history differs. Each rollout runs for --minutes and is then stopped;
the table gives the groups done and the sampled tokens a second at that point (its progress line).

    python bench/bench_after_training.py runs/real/rft/01/questions.parquet --model runs/real/sft \\
        --search local:runs/real/real/index.sqlite --sft-data runs/real/world/sft.parquet \\
        --config examples/real.toml --group-size 2 --sft-steps 40 --minutes 18
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("fresh", "inproc", "child")
LINE = re.compile(r"rollout: (\d+)/\d+ groups .*?elapsed ([\d:]+).*?(\d+) tok/s")


def arm(args) -> None:
    """One arm, in this process (the bench runs itself once per arm)."""
    from atomcli import heap
    heap.start("run-all")
    from atomcli import config, envelope
    from atomcli.context import Context
    from atomcli.stages import rollout, rollout_io, sft
    from atomcli.stages.run_all import child
    data = config.load_file(args.config) if args.config else {}
    ctx = Context()
    work = Path(args.work)
    if args.arm != "fresh":
        cfg = dataclasses.replace(config.build(sft.SFTConfig, config.section(data, "sft")), max_steps=args.sft_steps)
        if args.arm == "child":
            heap.set_ceiling(child.train("sft", sft, cfg, args.sft_data, work / "sft", ctx)["ceiling"])
        else:
            envelope.table_to_checkpoint("sft", sft, cfg, args.sft_data, str(work / "sft"), ctx)
        ctx.forget_models()
        heap.release()
    if args.ceiling:  # the fresh arm's stand-in for the SFT's estimate (a higher one set by an SFT stays)
        heap.set_ceiling(int(args.ceiling * 2**30))
    r = dataclasses.replace(config.build(rollout.RolloutConfig, config.section(data, "rollout")), model=args.model,
                            search=args.search, group_size=args.group_size, seed=args.seed)
    table = envelope.read_input(args.questions, "rollout")
    print(f"ceiling {heap.guard.ceiling if heap.guard else None}", file=sys.stderr, flush=True)
    with heap.unbounded():
        rollout_io.run_to_file(rollout, table, r, ctx, out=str(work / "rollout.parquet"), fmt=None, resume=False)


def run(name: str, args, work: Path) -> dict:
    cmd = [sys.executable, __file__, *sys.argv[1:], "--arm", name, "--work", str(work)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ATOM_HEAP": "retain", "PYTHONPATH": str(ROOT)}
    log = work / "log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stderr=err, stdout=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        started = None
        while proc.poll() is None:
            time.sleep(5)
            text = log.read_text(errors="replace")
            if started is None and "rollout: " in text:
                started = time.time()
            if started is not None and time.time() - started > args.minutes * 60:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    lines = LINE.findall(log.read_text(errors="replace"))
    if not lines:
        raise SystemExit(f"arm {name} sampled nothing:\n{log.read_text(errors='replace')[-3000:]}")
    groups, elapsed, tok_s = lines[-1]
    return {"arm": name, "groups": int(groups), "elapsed": elapsed, "tok_s": int(tok_s), "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("questions")
    ap.add_argument("--model", required=True, help="the checkpoint every arm samples")
    ap.add_argument("--search", required=True, help="as `atom rollout --search` (a local index for a fair timing)")
    ap.add_argument("--sft-data", required=True, help="the SFT table the inproc and child arms train on")
    ap.add_argument("--config", default="", help="a TOML file whose [sft] and [rollout] sections set the settings")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-steps", type=int, default=40)
    ap.add_argument("--minutes", type=float, default=18.0, help="how long each arm's rollout runs")
    ap.add_argument("--ceiling", type=float, default=0.0, help="GB: the fresh arm's ceiling (the SFT's estimate)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        return arm(args)
    names = args.arms.split(",")
    if set(names) - set(ARMS):
        raise SystemExit(f"unknown arm(s) {', '.join(sorted(set(names) - set(ARMS)))}; choose from {', '.join(ARMS)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            work = Path(tmp) / name
            work.mkdir()
            print(f"{name}: load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            rows.append(run(name, args, work))
            print(rows[-1], file=sys.stderr, flush=True)
    f = rows[0]
    print(f"{'arm':8} {'groups':>6} {'at':>6} {'tok/s':>6} {'x tok/s':>7} {'load':>5}")
    for r in rows:
        print(f"{r['arm']:8} {r['groups']:6d} {r['elapsed']:>6} {r['tok_s']:6d} {r['tok_s'] / f['tok_s']:7.2f} "
              f"{r['load']:5.2f}")


if __name__ == "__main__":
    main()
