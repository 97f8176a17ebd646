"""Side by side: training steps of the demo model with glibc's default heap (`ATOM_HEAP=release`) and with
`atomcli.heap.retain()` (what `atom` does when it starts).

Each arm runs in its own process (mallopt settings last for a process), the arms alternate for `--rounds` rounds
so that a change in the machine's load hits both, and each process runs `--steps` steps of SmolLM2-135M (fp32
master weights, bf16 autocast as `atom sft --precision bf16`, AdamW) on a batch of random token ids as long as the
longest SFT rows. It prints, per arm, the median seconds a step (the first step, which loads kernels, left out),
the CPU time split into user and system, the minor page faults a step and the peak resident size, then the ratios.

    python bench/heap.py                     # 2 rounds x 4 steps, batch 2 x 1536 tokens (about 8 minutes here)
    python bench/heap.py --rounds 1 --steps 3 --seq 1024
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def worker(steps: int, batch: int, seq: int) -> dict:
    """Run the steps in this process under the heap policy ATOM_HEAP names; return its measurements."""
    import resource
    import time

    from atomcli import heap
    retained = heap.retain()  # before torch allocates, as `atom` does
    import torch
    from transformers import AutoModelForCausalLM

    from atomcli import models
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(models.resolve(models.DEMO_MODEL), dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    times, faults = [], []
    for _ in range(steps):
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before.ru_minflt)
    use = resource.getrusage(resource.RUSAGE_SELF)
    return {"retained": retained, "step_s": times[1:] or times, "minflt": faults[1:] or faults,
            "user_s": use.ru_utime, "sys_s": use.ru_stime, "peak_rss_gb": use.ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4, help="steps per process (the first is left out of the median)")
    ap.add_argument("--rounds", type=int, default=2, help="processes per arm, alternating")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1536, help="tokens per row (the longest SFT rows are about 1,500)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps, args.batch, args.seq)))
        return
    from atomcli import heap
    runs: dict[str, list[dict]] = {heap.RELEASE: [], heap.RETAIN: []}
    for r in range(args.rounds):
        for policy in runs:
            env = dict(os.environ, HF_HUB_OFFLINE="1", **{heap.ENV: policy})
            cmd = [sys.executable, __file__, "--worker", "--steps", str(args.steps), "--batch", str(args.batch),
                   "--seq", str(args.seq)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
            if out.returncode != 0:  # show why the worker died (a traceback, an OOM kill) instead of a bare exit code
                tail = "\n".join(out.stderr.strip().splitlines()[-20:])
                sys.exit(f"round {r + 1} {policy}: the worker exited with {out.returncode}\n{tail}")
            runs[policy].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {policy}: {statistics.median(runs[policy][-1]['step_s']):.1f} s a step",
                  file=sys.stderr)
    rows = {}
    for policy, got in runs.items():
        rows[policy] = {
            "step_s": statistics.median(s for g in got for s in g["step_s"]),
            "minflt_per_step": statistics.median(f for g in got for f in g["minflt"]),
            "sys_share": sum(g["sys_s"] for g in got) / sum(g["sys_s"] + g["user_s"] for g in got),
            "peak_rss_gb": max(g["peak_rss_gb"] for g in got),
        }
    print(f"batch {args.batch} x {args.seq} tokens, {args.rounds} rounds x {args.steps} steps per arm\n")
    print("| heap | s / step (median) | minor faults / step | system share of CPU time | peak RSS (GB) |")
    print("|---|---|---|---|---|")
    for policy, row in rows.items():
        print(f"| {policy} | {row['step_s']:.2f} | {row['minflt_per_step']:,.0f} | {row['sys_share']:.0%} | "
              f"{row['peak_rss_gb']:.1f} |")
    a, b = rows[heap.RELEASE], rows[heap.RETAIN]
    print(f"\nspeed-up (release / retain step time): {a['step_s'] / b['step_s']:.2f}x; "
          f"peak RSS ratio (retain / release): {b['peak_rss_gb'] / a['peak_rss_gb']:.2f}")


if __name__ == "__main__":
    main()
