"""`atom --help` latency: a fresh subprocess each time, median of `--repeats` (cold imports included).

`cli.py` imports every stage module to build its flags, so a heavy import (torch,
transformers, trl) at module top level anywhere would show up here as seconds. Also times
`python -c pass` with the same interpreter as the floor, and `atom rollout --help`.

    .venv/bin/python bench/bench_cli.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(cmd: list[str], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True)
        out.append(time.perf_counter() - t0)
        if proc.returncode:
            sys.exit(f"{' '.join(cmd)} failed: {proc.stderr.decode()[-500:]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    atom = shutil.which("atom", path=str(Path(sys.executable).parent)) or "atom"
    rows = [("python -c pass", [sys.executable, "-c", "pass"]),
            ("atom --help", [atom, "--help"]),
            ("atom rollout --help", [atom, "rollout", "--help"])]
    timed(rows[1][1], 1)  # page cache warm, as on a machine where atom was just installed and run
    print(f"{'command':>22} {'p50 s':>7} {'min s':>7} {'max s':>7}")
    for label, cmd in rows:
        t = timed(cmd, args.repeats)
        print(f"{label:>22} {statistics.median(t):>7.3f} {min(t):>7.3f} {max(t):>7.3f}")


if __name__ == "__main__":
    main()
