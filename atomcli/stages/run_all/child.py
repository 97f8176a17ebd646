"""run-all's checkpoint-writing training stages (its SFT, the rejection-sampling rounds' tunes) in a child process.

Why: a process that has trained samples slower afterwards. In one process after an SFT, the real preset's round-1
rollout kept a slower pace than in a fresh process on the same checkpoint and questions, with the same CPU profile,
only slower (bench/RESULTS.md); what training leaves behind in the process is the cause, its heap of holes sized for
activations over many GB the suspect. A child started afresh (a new interpreter, not `fork`: a forked child would
inherit that heap and OpenMP's threads) trains, saves its checkpoint and exits, and everything it allocated goes
back to the system with it; run-all's own process only samples. grpo-step stays in-process: it continues the
resident policy in memory (atomcli/train/resident.py).

The child keeps the heap as `atom sft` does (atomcli/heap.py) and runs the same envelope as the command. It reports
back its heap guard's ceiling, which run-all's process adopts for its sampling as before, and its trims. An
InputError comes back as the same one-line error (exit 2); any other failure as an error with the child's
traceback; a child killed by a signal (the out-of-memory killer) as an error that says so. A child dies with
run-all's process (Linux: PR_SET_PDEATHSIG), so a killed run-all never leaves one training into its folder.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import signal
import traceback
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class StageFailed(RuntimeError):
    """A training stage's child failed in a way that is not the user's input: the last line of its traceback (the
    whole traceback is the cause, a ChildTraceback), or its signal."""


class ChildTraceback(Exception):
    """The child's own traceback, as text."""


# The child's whole program: the parent's sys.path first (run-all may run from a source folder), then the job.
# `python -c` rather than multiprocessing's spawn, which would run the caller's main module again in the child.
CHILD = ("import pickle, sys; sys.path[:0] = [p for p in pickle.load(sys.stdin.buffer) if p not in sys.path]; "
         "from atomcli.stages.run_all.child import main; main(int(sys.argv[1]), int(sys.argv[2]))")


def train(stage: str, mod, cfg, inp, out, ctx) -> dict:
    """`envelope.table_to_checkpoint(stage, mod, cfg, inp, out, ...)` in a fresh child process; returns what the
    child reports: its pid, its heap guard's ceiling (bytes or None), trims, and its resident MB at the end and at
    its peak (the footprint of the run is run-all's own plus this)."""
    import pickle
    import subprocess
    import sys

    from atomcli.errors import InputError
    job = (stage, mod.__name__, cfg, str(inp), str(out), ctx.quiet, str(ctx.home))
    r, w = os.pipe()
    try:
        # its stdout is run-all's stderr: run-all's stdout is data, and a training stage only logs
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(w), str(os.getpid())], stdin=subprocess.PIPE,
                                stdout=2, pass_fds=(w,))
    finally:
        os.close(w)  # the child holds the only writing end: the reply ends when it exits
    with os.fdopen(r, "rb") as reply:
        try:
            try:
                pickle.dump(sys.path, proc.stdin)
                pickle.dump(job, proc.stdin)
                proc.stdin.close()
            except BrokenPipeError:  # it died before it read the job: its exit code says how
                pass
            data = reply.read()
            proc.wait()
        finally:
            if proc.poll() is None:  # run-all itself was interrupted (Ctrl-C reaches both; make sure)
                proc.terminate()
                proc.wait()
    kind, payload = pickle.loads(data) if data else ("died", None)
    if kind == "ok":
        return payload
    if kind == "input":
        raise InputError(payload.pop("what"), **payload)
    if kind == "error":  # one line; the child's traceback is its cause (shown with --debug)
        last = payload.strip().splitlines()[-1] if payload.strip() else "no traceback"
        raise StageFailed(f"{stage} failed in its child process: {last}") from ChildTraceback(payload)
    code = proc.returncode
    how = f"was killed by signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else \
        f"exited with code {code}"
    hint = " (SIGKILL: often the out-of-memory killer; see `dmesg`)" if code == -signal.SIGKILL else ""
    raise StageFailed(f"{stage}'s child process {how} before it finished{hint}")


def main(reply_fd: int, parent: int) -> None:
    """The child: die with the parent, keep the heap as `atom <stage>` does, run the job read from stdin, and write
    the outcome to `reply_fd` (pickled: "ok" and the report, "input" and the InputError's fields, or "error" and a
    traceback)."""
    import pickle
    import sys
    _die_with(parent)
    with os.fdopen(reply_fd, "wb") as reply:
        reply.write(pickle.dumps(_run(pickle.load(sys.stdin.buffer))))


def _run(job) -> tuple[str, object]:
    stage, module, cfg, inp, out, quiet, home = job
    from atomcli import heap
    from atomcli.errors import InputError
    try:
        heap.start(stage)  # the kept heap and its guard where `atom <stage>` has them
        from atomcli import envelope
        from atomcli.context import Context
        envelope.table_to_checkpoint(stage, importlib.import_module(module), cfg, inp, out,
                                     Context(quiet=quiet, home=Path(home)))
    except InputError as e:
        return "input", {"what": e.what, "file": e.file, "row": e.row, "column": e.column, "hint": e.hint}
    except BaseException:  # noqa: BLE001 - everything goes back to run-all, which decides
        return "error", traceback.format_exc()
    g = heap.guard
    return "ok", {"pid": os.getpid(), "ceiling": g.ceiling if g else None, "trims": g.trims if g else 0,
                  "bound_trims": g.bound_trims if g else 0, "ceiling_trims": g.ceiling_trims if g else 0,
                  "resident_mb": heap.resident_mb(), "peak_mb": heap.peak_resident_mb()}


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this child when run-all's process dies (Linux; elsewhere nothing), and exit at once
    if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)
