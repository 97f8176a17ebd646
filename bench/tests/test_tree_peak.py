"""bench/tree_peak.py: the peak is summed over the command's process tree, unlike `time -v`'s largest process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A parent holding 300 MB starts a child that holds 200 MB for 3 s, then exits with code 7.
TREE = ("import subprocess, sys; held = bytearray(300_000_000); "
        "subprocess.run([sys.executable, '-c', 'import time; b = bytearray(200_000_000); time.sleep(3)']); "
        "sys.exit(7)")


def test_the_peak_is_the_sum_of_parent_and_child(tmp_path):
    log = tmp_path / "mem.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tree_peak.py"), "--every", "0.2", "--log", str(log),
                           "--", sys.executable, "-c", TREE], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 7, proc.stderr  # the command's exit code is passed on
    line = proc.stderr.strip().splitlines()[-1]
    rss = float(line.split("RSS ")[1].split(" GB")[0])
    largest = float(line.split("largest single process ")[1].split(" GB")[0])
    assert "(2 processes)" in line
    # GB as time -v counts them (million kB): 300 MB is 0.29, 200 MB 0.20, each interpreter ~0.01 more
    assert 0.47 <= rss < 0.7      # both at once (bytearray's pages are written: zero-filled)
    assert 0.28 <= largest < 0.4  # what time -v would say
    rows = log.read_text().splitlines()
    assert rows[0] == "s,procs,rss_mb,pss_mb,largest_rss_mb" and len(rows) > 5


def test_it_needs_a_command():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tree_peak.py")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and "give the command after --" in proc.stderr
