"""Side by side: a preset's SFT under different memory settings, peak resident size and seconds a step.

Each arm is one `atom sft` process on the preset's world's SFT set with the preset's [sft] settings (demo: rows one
at a time accumulated to 4, up to 2,048 tokens, fp32, gradient checkpointing; real: batches of 2 x 2,
bf16, no checkpointing) except for the arm's own changes, run under `/usr/bin/time -v` so that
the peak resident size is the kernel's figure for the whole process. The arms run one after another in one
invocation (never two at once: two cores), so a change in the machine's load shows in `uptime` lines printed
between them. It prints a table and the ratios of each arm to the first one.

    python bench/bench_sft_memory.py                      # all arms, one step on the set's 4 longest rows
    python bench/bench_sft_memory.py --full --steps 14    # the demo's whole SFT for each arm (much longer)
    python bench/bench_sft_memory.py --preset real        # the real preset's SFT (its stepwise-real world)
    python bench/bench_sft_memory.py --preset real --arms real-baseline,real --baseline f14b056 --full --steps 8
                                                          # today's code against an older commit's, same settings
    python bench/bench_sft_memory.py --preset real --arms real-unbounded,real --full --steps 40
                                                          # the kept heap with and without its bound
    python bench/bench_sft_memory.py --preset real --arms real-noceiling,real --full --steps 60
                                                          # and without its ceiling (the memory estimate)
    python bench/bench_sft_memory.py --preset real --arms real,real-in-13g --full --steps 20
                                                          # the same run inside a 13 GiB memory cgroup

An arm named "...-in-NNg" runs inside a fresh memory cgroup limited to NN GiB (a smaller machine, as a container or
a 16 GB laptop would give it; needs a writable cgroup, e.g. root in a container).

An arm marked "baseline" runs `atom` from a git worktree of `--baseline` (made in the temporary folder), so a change
in the code is compared side by side with the code before it on the same data and settings.

The default is the worst batch: one optimizer step (4 rows) on the SFT set's 4 longest rows, which is where the
demo's SFT peaks; `--full` trains on the whole set as the demo does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATOM = [sys.executable, "-m", "atomcli"]

# The demo preset's [sft] (atomcli's DEMO preset) and the arms' changes to it. "before" is the preset as first
# shipped (batches of 2); "batch1" its rows-one-at-a-time form without checkpointing (the preset at commit 9913753).
BASE = ["--epochs", "1", "--lr", "3e-4", "--batch-size", "1", "--grad-accum", "4", "--max-length", "2048",
        "--warmup-ratio", "0.1", "--gradient-checkpointing", "--precision", "fp32"]
ARMS = {
    "before": (["--batch-size", "2", "--grad-accum", "2", "--no-gradient-checkpointing"], {}),
    "batch1": (["--no-gradient-checkpointing"], {}),
    "batch1-release": (["--no-gradient-checkpointing"], {"ATOM_HEAP": "release"}),
    "preset": ([], {}),
    "preset-baseline": ([], {}),
    "preset-release": ([], {"ATOM_HEAP": "release"}),
    "bf16": (["--precision", "bf16"], {}),
}
# The real preset's [sft] (one epoch; --steps bounds it here) and its arms: the same update in micro-batches of one
# row, with and without gradient checkpointing; the kept heap without its bound or its ceiling (atomcli/heap.py).
REAL_BASE = ["--epochs", "1", "--lr", "2e-4", "--batch-size", "2", "--grad-accum", "2", "--max-length", "2048",
             "--warmup-ratio", "0.1", "--no-gradient-checkpointing", "--precision", "bf16", "--sampling", "length"]
REAL_ARMS = {
    "real": ([], {}),
    "real-baseline": ([], {}),
    "real-unbounded": ([], {"ATOM_HEAP_BOUND": "0"}),
    "real-noceiling": ([], {"ATOM_HEAP_CEILING": "0"}),
    "real-batch1": (["--batch-size", "1", "--grad-accum", "4"], {}),
    "real-batch1-ckpt": (["--batch-size", "1", "--grad-accum", "4", "--gradient-checkpointing"], {}),
    "real-in-13g": ([], {}),
}
# Arms that run the preset's settings on the code of --baseline (a git worktree), to compare a change side by side.
BASELINE_ARMS = {"preset-baseline", "real-baseline"}
PRESETS = {"demo": (BASE, ARMS, ["--style", "classic"]),
           "real": (REAL_BASE, REAL_ARMS, ["--style", "stepwise-real", "--snippets", "query"])}


def _override(base: list[str], extra: list[str]) -> list[str]:
    """`base` with each flag in `extra` replacing its earlier value (a flag pair or a bare switch)."""
    out = list(base)
    i = 0
    while i < len(extra):
        flag = extra[i]
        takes_value = i + 1 < len(extra) and not extra[i + 1].startswith("--")
        name = flag.removeprefix("--no-").removeprefix("--")
        for j, b in enumerate(out):
            if b.startswith("--") and b.removeprefix("--no-").removeprefix("--") == name:
                del out[j:j + (2 if j + 1 < len(out) and not out[j + 1].startswith("--") else 1)]
                break
        out += extra[i:i + (2 if takes_value else 1)]
        i += 2 if takes_value else 1
    return out


def run_arm(name: str, data: Path, steps: int, work: Path, preset: str = "demo", code: Path = ROOT) -> dict:
    base, arms, _ = PRESETS[preset]
    extra, env_extra = arms[name]
    out = work / f"ckpt-{name}"
    cmd = ["/usr/bin/time", "-v", *ATOM, "sft", str(data), "--model", "smollm2", "--out", str(out),
           "--max-steps", str(steps), *_override(base, extra)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **env_extra, "PYTHONPATH": str(code)}
    cgroup = _cgroup(name)
    if cgroup is not None:  # the shell joins the cgroup, then becomes the measured command
        cmd = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=code)
    finally:
        if cgroup is not None:
            from atomcli import sysmem
            sysmem.remove_cgroup(cgroup)
    if proc.returncode != 0:
        raise SystemExit(f"arm {name} failed:\n{proc.stderr[-3000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)[1])
    metrics = json.loads((out / "atom_train.json").read_text()) if (out / "atom_train.json").exists() else {}
    m = re.search(r"sft: (\d+) steps in ([\d.]+) s, loss ([\d.]+) -> ([\d.]+)", proc.stderr)
    return {"arm": name, "peak_gb": peak_kb / 2**20, "steps": int(m[1]), "seconds": float(m[2]),
            "s_per_step": float(m[2]) / int(m[1]), "loss_first": float(m[3]), "loss_last": float(m[4]),
            "load": os.getloadavg()[0], "metrics_file": bool(metrics)}


def _cgroup(arm: str) -> Path | None:
    """A fresh memory cgroup limited to the arm's "-in-NNg" GiB, or None for an arm without one."""
    m = re.search(r"-in-(\d+)g$", arm)
    if m is None:
        return None
    from atomcli import sysmem
    made = sysmem.limited_cgroup(int(m[1]) << 30, "atom-bench")
    if made is None:
        raise SystemExit(f"arm {arm}: cannot make a memory cgroup here; run as root or leave this arm out")
    return made


def _longest(src: Path, dst: Path, n: int) -> Path:
    """The `n` rows of `src` with the most message text (the SFT's largest batch) written to `dst`."""
    import pyarrow.parquet as pq
    table = pq.read_table(src)
    size = [sum(len(m["content"] or "") for m in ms) for ms in table.column("messages").to_pylist()]
    pq.write_table(table.take(sorted(range(len(size)), key=lambda i: -size[i])[:n]), dst)
    return dst


def _worktree(rev: str, dst: Path) -> Path:
    """A detached git worktree of `rev` at `dst` (main removes it when the arms are done)."""
    if not rev:
        raise SystemExit(f"the arms {', '.join(sorted(BASELINE_ARMS))} run older code: name its commit with "
                         "--baseline REV")
    subprocess.run(["git", "worktree", "add", "--detach", str(dst), rev], check=True, cwd=ROOT, capture_output=True)
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--full", action="store_true", help="the whole SFT set, not its 4 longest rows")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    ap.add_argument("--arms", default="", help="comma-separated (default: the preset's arms on today's code)")
    ap.add_argument("--world", default="", help="a demo-world folder (made if not given)")
    ap.add_argument("--baseline", default="", help="the commit that arms marked baseline run (a git worktree)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        world = Path(args.world) if args.world else work / "world"
        if not args.world:
            subprocess.run([*ATOM, "demo-world", "--out", str(world), *PRESETS[args.preset][2]], check=True,
                           capture_output=True, cwd=ROOT)
        data = world / "sft.parquet"
        if not args.full:
            data = _longest(data, work / "longest.parquet", 4)
        rows = []
        names = args.arms.split(",") if args.arms else [n for n in PRESETS[args.preset][1] if n not in BASELINE_ARMS]
        old = _worktree(args.baseline, work / "baseline") if BASELINE_ARMS & set(names) else None
        try:
            for name in names:
                print(f"{name}: load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
                rows.append(run_arm(name, data, args.steps, work, args.preset,
                                    old if name in BASELINE_ARMS else ROOT))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            if old is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, capture_output=True)
    first = rows[0]
    print(f"{'arm':16} {'peak GB':>8} {'s/step':>8} {'loss':>15} {'x peak':>7} {'x time':>7} {'load':>5}")
    for r in rows:
        print(f"{r['arm']:16} {r['peak_gb']:8.2f} {r['s_per_step']:8.1f} {r['loss_first']:7.4f}>{r['loss_last']:7.4f} "
              f"{r['peak_gb'] / first['peak_gb']:7.2f} {r['s_per_step'] / first['s_per_step']:7.2f} {r['load']:5.2f}")


if __name__ == "__main__":
    main()
