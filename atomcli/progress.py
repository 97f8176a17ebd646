"""Progress on stderr for every stage that can run long: one helper, one look.

Owns how a long stage (rollout, and eval's rollout, sft, score-rrm, score-ig, grpo-step)
says how far it has got. On a terminal: a rich bar with the count, the elapsed time and an
ETA, plus the stage's own figures (tokens/s, loss...); it is transient, so the stage's summary
is what stays. When stderr is not a terminal (a log file, a pipe, cron, CI): a plain line

    rollout: 12/40 groups (30%), elapsed 1:02, ETA 2:25 | 410 tok/s ...

every EVERY seconds (default 30; environment ATOM_PROGRESS_EVERY), written by a timer thread,
so a log shows signs of life even while one long step runs, and a closing line when the work
is done (only for a run that lasted at least one period, so that short runs stay as quiet as
before). A quiet context (`Context(quiet=True)`, the non-main ranks of a launch) shows nothing.

Stages report with `advance(n)` and `update(completed=, total=, info=)`; both are safe to call
from any thread. Counts may be fractional (score-ig reports work done in trajectory units).

It also owns what the libraries underneath may print: `quiet_libraries()`, called by every `atom`
command unless --debug or ATOM_DEBUG=1, turns off their progress bars ("Loading weights", dataset
mapping, "Writing model shards"), their info and warning logs, and Python warnings
(FutureWarning, DeprecationWarning, UserWarning), so that stderr holds atomcli's lines only.
"""

from __future__ import annotations

import os
import threading
import time

EVERY = float(os.environ.get("ATOM_PROGRESS_EVERY", "") or 30.0)  # seconds between plain progress lines

# read by huggingface_hub, transformers and datasets when they are imported; a value the user set wins
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
             "TRANSFORMERS_VERBOSITY": "error", "DATASETS_VERBOSITY": "error",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def quiet_libraries() -> None:
    """No third-party progress bars, log lines below errors, or Python warnings (atomcli raises none)."""
    import sys
    import warnings
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    # a library imported already has read its environment: tell it directly
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets
        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()


def clock(seconds: float) -> str:
    """1:02, 1:02:03."""
    s = int(max(seconds, 0) + 0.5)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """`with Progress(context, "rollout", total=40, unit="groups") as p: ... p.advance()`."""

    def __init__(self, context, what: str, total: float | None, unit: str = "", *, every: float | None = None):
        self.context, self.what, self.total, self.unit = context, what, total, unit
        self.every = EVERY if every is None else every
        self.completed = 0.0
        self.info = ""
        self.lines = 0  # plain lines written
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar = self._task = self._thread = None

    # --- lifecycle ----------------------------------------------------------------------------

    def __enter__(self):
        self.t0 = time.monotonic()
        if self.context.quiet:
            return self
        console = self.context.console
        if console.is_terminal:
            from rich.errors import LiveError
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as Bar
            bar = Bar(TextColumn(self.what), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                      TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                      TextColumn("{task.fields[info]}", markup=False), console=console, transient=True)
            try:
                bar.start()
            except LiveError:  # another display is live on this console: its owner reports
                return self
            self._bar, self._task = bar, bar.add_task(self.what, total=self.total, info="")
        elif self.every > 0:
            self._thread = threading.Thread(target=self._tick, name="atom-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            # a run that lasted a period gets its closing line even when the timer thread never got the GIL in
            # time to print a tick (a 15 ms run with a 5 ms period on a loaded machine made a flaky test)
            if (self.lines or time.monotonic() - self.t0 >= self.every) and exc_type is None:
                self._line(done=True)

    # --- reporting ----------------------------------------------------------------------------

    def advance(self, n: float = 1, info: str | None = None) -> None:
        with self._lock:
            self.completed += n
            if info is not None:
                self.info = info
            self._show()

    def update(self, completed: float | None = None, total: float | None = None, info: str | None = None) -> None:
        with self._lock:
            if completed is not None:
                self.completed = completed
            if total is not None:
                self.total = total
            if info is not None:
                self.info = info
            self._show()

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, total=self.total, info=self.info)

    # --- plain lines (stderr is not a terminal) --------------------------------------------------

    def line(self, done: bool = False) -> str:
        """The plain progress line for the current state."""
        with self._lock:
            completed, total, info = self.completed, self.total, self.info
        elapsed = time.monotonic() - self.t0
        unit = f" {self.unit}" if self.unit else ""
        if total:
            text = f"{self.what}: {completed:.0f}/{total:.0f}{unit} ({min(completed / total, 1):.0%})"
        else:
            text = f"{self.what}: {completed:.0f}{unit}"
        if done:
            text += f", done in {clock(elapsed)}"
        else:
            eta = clock(elapsed * (total - completed) / completed) if total and completed > 0 else "?"
            text += f", elapsed {clock(elapsed)}, ETA {eta}"
        return text + (f" | {info}" if info else "")

    def _line(self, done: bool = False) -> None:
        from atomcli.safety import visible
        self.context.console.print(visible(self.line(done)), markup=False, highlight=False, soft_wrap=True)
        self.lines += 1

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            self._line()
