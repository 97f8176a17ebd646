"""run-all's checkpoint-writing training stages (its SFT, the rejection-sampling rounds' tunes) in a child process.

Why: a process that has trained samples slower afterwards. In one process, the real preset's round-1 rollout ran
at about 0.8x the pace it had in a fresh process on the same checkpoint and questions, with the same CPU profile
(bench/RESULTS.md): what training leaves behind (a heap of holes sized for its activations, scattered over many
GB) makes the same sampling work slower. A child started afresh (`spawn`, not `fork`: a forked child would inherit
that heap and OpenMP's threads) trains, saves its checkpoint and exits, and everything it allocated goes back to the
system with it; run-all's own process only samples. grpo-step stays in-process: it continues the resident policy in
memory (atomcli/train/resident.py).

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
    """A training stage's child failed in a way that is not the user's input: its traceback, or its signal."""


def train(stage: str, mod, cfg, inp, out, ctx) -> dict:
    """`envelope.table_to_checkpoint(stage, mod, cfg, inp, out, ...)` in a fresh child process; returns what the
    child reports: its pid, its heap guard's ceiling (bytes or None), trims and resident MB at the end."""
    import multiprocessing

    from atomcli.errors import InputError
    mp = multiprocessing.get_context("spawn")
    recv, send = mp.Pipe(duplex=False)
    proc = mp.Process(target=_child, name=f"atom-{stage}",
                      args=(send, os.getpid(), stage, mod.__name__, cfg, str(inp), str(out), ctx.quiet, str(ctx.home)))
    proc.start()
    send.close()  # the child holds the only writing end: recv() raises EOFError when it dies without a word
    try:
        try:
            kind, payload = recv.recv()
        except EOFError:
            kind, payload = "died", None
        proc.join()
    finally:
        if proc.is_alive():  # run-all itself was interrupted (Ctrl-C reaches both; make sure)
            proc.terminate()
            proc.join()
        recv.close()
    if kind == "ok":
        return payload
    if kind == "input":
        raise InputError(payload.pop("what"), **payload)
    if kind == "error":
        raise StageFailed(f"{stage} failed in its child process:\n{payload}")
    code = proc.exitcode
    how = f"was killed by signal {-code} ({signal.Signals(-code).name})" if code is not None and code < 0 else \
        f"exited with code {code}"
    hint = " (SIGKILL: often the out-of-memory killer; see `dmesg`)" if code == -signal.SIGKILL else ""
    raise StageFailed(f"{stage}'s child process {how} before it finished{hint}")


def _child(send, parent: int, stage: str, module: str, cfg, inp: str, out: str, quiet: bool, home: str) -> None:
    _die_with(parent)
    from atomcli import heap
    heap.start(stage)  # the kept heap and its guard where `atom <stage>` has them
    from atomcli import envelope
    from atomcli.context import Context
    from atomcli.errors import InputError
    try:
        envelope.table_to_checkpoint(stage, importlib.import_module(module), cfg, inp, out,
                                     Context(quiet=quiet, home=Path(home)))
    except InputError as e:
        send.send(("input", {"what": e.what, "file": e.file, "row": e.row, "column": e.column, "hint": e.hint}))
        return
    except BaseException:  # noqa: BLE001 - everything goes back to run-all, which decides
        send.send(("error", traceback.format_exc()))
        return
    g = heap.guard
    send.send(("ok", {"pid": os.getpid(), "ceiling": g.ceiling if g else None, "trims": g.trims if g else 0,
                      "bound_trims": g.bound_trims if g else 0, "ceiling_trims": g.ceiling_trims if g else 0,
                      "resident_mb": heap.resident_mb()}))


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this child when run-all's process dies (Linux; elsewhere nothing), and exit at once
    if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)
