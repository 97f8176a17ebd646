"""Side by side: one `atom rollout` of a trained checkpoint under different code or heap settings.

Each arm is one `atom rollout` process on the same questions, checkpoint, search index and [rollout] settings, run
under `/usr/bin/time -v` (peak resident size for the whole process). The arms run one after another in one
invocation (never two at once: two cores), and it prints a table with each arm's wall time, sampled tokens a
second, peak resident size, the ratios to the first arm, and whether the arm sampled the same tokens as the first
(same seed: a change that only moves work around must not change a token).

    python bench/bench_rollout_arms.py runs/real/rft/01/questions.parquet --model runs/real/sft \\
        --search local:runs/real/real/index.sqlite --config examples/real.toml --limit 13 \\
        --arms baseline,now,retain --baseline 156e7a7

Arms:
  now       today's code, the heap as `atom rollout` keeps it (glibc's defaults)
  baseline  the code of --baseline (a git worktree made in the temporary folder)
  retain    today's code with ATOM_HEAP=retain, the kept heap a run-all process samples with
  retain-unbounded  the same without the kept heap's bound (ATOM_HEAP_BOUND=0)
  release   today's code with ATOM_HEAP=release: glibc's defaults whatever the command
  retain-ceiling  retain-unbounded under a 4 GB ceiling (ATOM_HEAP_CEILING=4): what a run-all process samples with,
            the ceiling there being its training stages' estimate; 4 GB lies below this rollout's kept heap
  X@baseline  arm X's heap settings on the code of --baseline (e.g. retain-unbounded@baseline)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {"now": {}, "baseline": {}, "retain": {"ATOM_HEAP": "retain"},
        "retain-unbounded": {"ATOM_HEAP": "retain", "ATOM_HEAP_BOUND": "0"}, "release": {"ATOM_HEAP": "release"},
        "retain-ceiling": {"ATOM_HEAP": "retain", "ATOM_HEAP_BOUND": "0", "ATOM_HEAP_CEILING": "4"}}


def run_arm(name: str, args, work: Path, code: Path) -> dict:
    out = work / f"{name}.parquet"
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "atomcli.cli", "rollout", str(Path(args.questions).resolve()),
           "--out", str(out), "--model", str(Path(args.model).resolve()), "--search", args.search,
           "--limit", str(args.limit), "--seed", str(args.seed)]
    if args.search.startswith("local:"):  # the arms run in another folder (the baseline's worktree)
        cmd[cmd.index(args.search)] = "local:" + str(Path(args.search.removeprefix("local:")).resolve())
    if args.config:
        cmd += ["--config", str(Path(args.config).resolve())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **ARMS[name.removesuffix("@baseline")], "PYTHONPATH": str(code)}
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"arm {name} failed:\n{proc.stderr[-3000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
    m = re.search(r"tokens sampled\s*│\s*(\d+) \(([\d.]+)/s while sampling\)", proc.stderr)
    return {"arm": name, "wall_s": wall, "tokens": int(m[1]), "tok_s": float(m[2]), "peak_gb": peak_kb / 2**20,
            "load": os.getloadavg()[0], "table": out}


def completions(path: Path) -> list:
    import pyarrow.parquet as pq
    t = pq.read_table(path, columns=["traj_id", "completion_ids"]).to_pylist()
    return sorted((r["traj_id"], r["completion_ids"]) for r in t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("questions")
    ap.add_argument("--model", required=True)
    ap.add_argument("--search", required=True, help="as `atom rollout --search` (a local index for a fair timing)")
    ap.add_argument("--config", default="", help="a TOML file whose [rollout] section sets the settings")
    ap.add_argument("--limit", type=int, default=13, help="the first N questions")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="baseline,now", help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--baseline", default="", help="the commit the baseline arm runs")
    args = ap.parse_args()
    names = args.arms.split(",")
    unknown = [n for n in names if n.removesuffix("@baseline") not in ARMS]
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    on_old = [n for n in names if n == "baseline" or n.endswith("@baseline")]
    if on_old and not args.baseline:
        raise SystemExit("the baseline arm runs older code: name its commit with --baseline REV")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = None
        if on_old:
            old = work / "baseline-code"
            subprocess.run(["git", "worktree", "add", "--detach", str(old), args.baseline], check=True, cwd=ROOT,
                           capture_output=True)
        try:
            for name in names:
                print(f"{name}: load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
                rows.append(run_arm(name, args, work, old if name in on_old else ROOT))
                print({k: v for k, v in rows[-1].items() if k != "table"}, file=sys.stderr, flush=True)
            first = completions(rows[0]["table"])
            for r in rows:
                r["same"] = completions(r["table"]) == first
        finally:
            if old is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    f = rows[0]
    print(f"{'arm':26} {'wall s':>7} {'tokens':>7} {'tok/s':>6} {'peak GB':>7} {'x time':>6} {'x peak':>6} "
          f"{'same':>5} {'load':>5}")
    for r in rows:
        print(f"{r['arm']:26} {r['wall_s']:7.1f} {r['tokens']:7d} {r['tok_s']:6.1f} {r['peak_gb']:7.2f} "
              f"{r['wall_s'] / f['wall_s']:6.2f} {r['peak_gb'] / f['peak_gb']:6.2f} {str(r['same']):>5} {r['load']:5.2f}")


if __name__ == "__main__":
    main()
