"""Peak memory of a command's whole process tree: `python bench/tree_peak.py [--log F] -- atom run-all ...`.

`/usr/bin/time -v` reports the largest single process's peak RSS. Since run-all trains in a child process, the
footprint a machine must hold is the parent's plus the child's at the same moment, so this samples every process
under the command once a second and keeps the largest sums: RSS (counts the shared libraries once per process) and
PSS (shares them out, the fairer sum). It prints one line at the end to stderr, and with `--log` a CSV of every
sample. The command's exit code is passed on.
"""

import argparse
import os
import subprocess
import sys
import time


def children_of() -> dict[int, list[int]]:
    """Every live process's children, from /proc/*/stat's parent field."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name in parentheses may hold spaces; the fields after its last ')' are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root: int) -> list[int]:
    kids, todo, seen = children_of(), [root], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(kids.get(pid, []))
    return seen


def rss_pss_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in kB from smaps_rollup; (0, 0) for a process that has gone."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--log", help="CSV of every sample: seconds, processes, RSS sum, PSS sum, largest RSS (MB)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("give the command after --")
    log = open(a.log, "w") if a.log else None
    if log:
        log.write("s,procs,rss_mb,pss_mb,largest_rss_mb\n")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    peak_rss = peak_pss = peak_one = peak_procs = 0
    while proc.poll() is None:
        sizes = [rss_pss_kb(pid) for pid in tree(proc.pid)]
        rss, pss = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
        one = max((s[0] for s in sizes), default=0)
        if rss > peak_rss:
            peak_rss, peak_procs = rss, sum(1 for s in sizes if s[0])
        peak_pss, peak_one = max(peak_pss, pss), max(peak_one, one)
        if log:
            log.write(f"{time.monotonic() - t0:.0f},{len(sizes)},{rss // 1024},{pss // 1024},{one // 1024}\n")
            log.flush()
        time.sleep(a.every)
    if log:
        log.close()
    minutes = (time.monotonic() - t0) / 60
    print(f"tree_peak: {minutes:.1f} min, exit {proc.returncode}; peak over the tree: RSS {peak_rss / 1e6:.2f} GB "
          f"({peak_procs} processes), PSS {peak_pss / 1e6:.2f} GB; largest single process {peak_one / 1e6:.2f} GB "
          "(GB = million kB, as time -v counts)", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
