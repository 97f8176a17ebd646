"""The process's heap policy: keep freed memory in the process instead of handing it back to the system, until the
machine runs short of memory.

Why: a CPU training step allocates and frees the same large tensors (logits of 49,152 columns per token, activations)
every step. glibc serves each allocation over 32 MB with a fresh `mmap` and unmaps it when freed, so every step the
kernel hands out new pages and zeroes them again; on a 2-core VM `perf` put most of an SFT's time in the kernel's page
zeroing (`clear_page_erms`). With `retain()` glibc serves every allocation from its heap (no `mmap`) and never trims
it, so a freed tensor's pages are reused as they are (in the main thread's arena, where CPU autograd allocates;
thread arenas still map and unmap). `bench/heap.py` measures both ways side by side (bench/RESULTS.md).

The cost is fragmentation: batches of other lengths free holes a larger tensor does not fit, and a heap that is never
trimmed keeps every one of them resident (the learn preset's SFT, batches of 4 x up to 2,048 tokens, once outgrew a
24 GB machine). So `retain()` also starts a guard thread: twice a second it reads the machine's available memory
(within the process's cgroup limit in a container or a Slurm job: atomcli.sysmem), and when that falls below
ATOM_HEAP_RESERVE (a share of the total, default 0.2) it calls `malloc_trim(0)`, which
hands the free pages inside the heap back to the system. Pages are re-zeroed only while memory is short; when it is
not, nothing changes. A guard that trims every step costs what the kept heap saves, so the presets train SFT in
micro-batches (of 1 or 2 rows, accumulated to 4) whose peak leaves the guard nothing to do, and `atom sft` pads
batches to a multiple of 256 tokens (`--pad-multiple`) so the heap sees a few tensor sizes (its effect alone is not
measured).

The guard also bounds the heap on a machine with memory to spare. It keeps the largest amount in use over the last
WINDOW_S seconds (glibc's `mallinfo2`), and when the process's resident memory exceeds that peak by more than a
share of it (ATOM_HEAP_BOUND, default BOUND_SHARE) plus BOUND_MIN_BYTES (plus what a trim left resident outside the
heap), it trims too. Without the bound a long SFT's holes piled up until the machine's reserve, far above what its
steps use (bench/RESULTS.md, "The process heap"); with it the heap keeps about one training step's worth of free
pages. Each such trim costs page faults when the pages are used again, so the bound trims at most once per
BOUND_COOLDOWN_S; ATOM_HEAP_BOUND=0 turns it off where memory is plentiful. run-all lifts the bound while it samples
(`unbounded()`: its rollouts and evals), where those page faults slowed the sampling (bench/RESULTS.md,
`bench_rollout_arms.py`) and the heap is handed back around each training stage anyway; the reserve and
the ceiling below still apply there (without a ceiling the bound is not lifted).

Between two trims for the bound the heap can still grow by one window's holes, several GB in a long SFT whose
batches change length. So the guard also keeps a ceiling: a training stage's memory check (atomcli/train/memory.py)
sets it to the stage's estimated peak, the figure the check compared with the machine's memory (in run-all, the
largest of its stages' estimates), and resident memory above it is trimmed at once (at most once per
CEILING_COOLDOWN_S), bound lifted or not. The process then stays within what its check said it needs. A trim that
leaves resident memory near the ceiling shows the estimate was low for this process: the ceiling then follows what
is in use instead of trimming at every look. ATOM_HEAP_CEILING sets it in GB instead of the estimate, `0` turns it
off.

Where it applies: `retain()` is a tune for training on a CPU, where it was measured. `atom` calls `start(command)`
when it starts, before torch allocates anything, and that retains the heap only for the commands that train
(`TRAINING`) on a machine without a CUDA device; evals, rollouts, `atom index` and GPU runs keep glibc's defaults.
`ATOM_HEAP=retain` asks for the kept heap in every command, `ATOM_HEAP=release` in none (a process that must hand
memory back while it waits); other C libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
import time

from atomcli import sysmem

ENV = "ATOM_HEAP"
AUTO, RETAIN, RELEASE = "auto", "retain", "release"
CHOICES = (AUTO, RETAIN, RELEASE)
TRAINING = frozenset({"sft", "grpo-step", "run-all"})  # the commands whose CPU training the kept heap was measured on
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# mallopt takes an int and glibc stores the trim threshold as a size_t: -1 becomes SIZE_MAX, "never trim"
# (the largest positive int would still hand back all free top-of-heap over 2 GiB, every step)
NEVER_TRIM = -1
RESERVE_ENV = "ATOM_HEAP_RESERVE"
DEFAULT_RESERVE = 0.2   # share of the machine's memory the guard keeps available
GUARD_INTERVAL_S = 0.5  # a training step allocates a few GB in about a second: poll faster than that
MAX_WAIT_S = 16.0       # the longest back-off after trims that left memory short (Guard)
WINDOW_S = 120.0        # how far back the guard's peak in use reaches: several training steps of the presets
BOUND_ENV = "ATOM_HEAP_BOUND"
BOUND_SHARE = 0.25      # resident memory may exceed that peak by this share of it (ATOM_HEAP_BOUND; 0: no bound)...
BOUND_MIN_BYTES = 1 << 30  # ...plus this (the interpreter, torch's code and Python's own arenas are not in the heap)
# The sampled peak in use misses the top of a backward pass (it lasts less than a look's interval), so in a long SFT
# the bound fired every ~35 s and the next step faulted the same pages back in. At most one bound trim per window
# caps that cost; the heap can outgrow its bound between two trims by one window's creep only.
BOUND_COOLDOWN_S = WINDOW_S
CEILING_ENV = "ATOM_HEAP_CEILING"
CEILING_COOLDOWN_S = 10.0  # a few steps' creep at most above the ceiling between two looks that trim
CEILING_NEAR = 0.9         # a trim that leaves resident memory above this share of the ceiling lifts it (docstring)


class _MallInfo2(ctypes.Structure):
    """glibc 2.33+'s `struct mallinfo2` (sizes in bytes, summed over all arenas)."""
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _glibc():
    """glibc's handle, or None on another C library."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError, TypeError):
        return None
    if hasattr(libc, "mallinfo2"):  # glibc 2.33+
        libc.mallinfo2.restype = _MallInfo2
    return libc


def policy() -> str:
    """The heap policy ATOM_HEAP asks for (auto by default); a value not in CHOICES is an error."""
    from atomcli.errors import InputError
    value = os.environ.get(ENV, AUTO).strip().lower() or AUTO
    if value not in CHOICES:
        raise InputError(f"{ENV}={value!r} is not a heap policy", hint=f"use one of: {', '.join(CHOICES)}")
    return value


def _env_share(name: str, default: float, top: float, what: str, hint: str) -> float:
    """A number from 0 to below `top` read from the environment variable `name` (`default` when unset); a share, or
    for the ceiling a number of GB."""
    from atomcli.errors import InputError
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < top:
        raise InputError(f"{name}={raw!r} is not {what}", hint=hint)
    return value


def reserve() -> float:
    """The share of the machine's memory the guard keeps available (ATOM_HEAP_RESERVE, 0 <= share < 1)."""
    return _env_share(RESERVE_ENV, DEFAULT_RESERVE, 1.0, "a share of memory",
                      f"a number from 0 (never hand memory back) to below 1, e.g. {DEFAULT_RESERVE}")


def bound_share() -> float | None:
    """How far resident memory may outgrow the recent peak in use, as a share of it (ATOM_HEAP_BOUND, default
    BOUND_SHARE); None for 0, which turns the bound off (a machine with memory to spare)."""
    return _env_share(BOUND_ENV, BOUND_SHARE, 100.0, "a share of the peak in use",
                      f"a number from 0 (no bound) up, e.g. {BOUND_SHARE}") or None


def ceiling_gb() -> float | None:
    """ATOM_HEAP_CEILING in GB (2**30 bytes): a number, 0 for no ceiling; None when unset (the stages' estimates)."""
    if not os.environ.get(CEILING_ENV, "").strip():
        return None
    return _env_share(CEILING_ENV, 0.0, float("inf"), "a number of gigabytes",
                      "e.g. ATOM_HEAP_CEILING=12, or 0 for no ceiling; unset: each training stage's estimate")


def set_ceiling(need: int) -> None:
    """What a training stage's memory check calls with its estimated peak in bytes: the guard's ceiling from now on,
    unless ATOM_HEAP_CEILING fixes it or an earlier stage of this process set a higher one (run-all: its sampling
    stages and smaller updates stay within its largest training stage's estimate). Nothing to do without a guard."""
    if guard is not None and ceiling_gb() is None:
        guard.ceiling = max(guard.ceiling or 0, need)


def available_share() -> float | None:
    """MemAvailable / MemTotal (each within the process's cgroup limit), or None where there is no /proc/meminfo."""
    fields = sysmem.meminfo()
    if not fields.get("MemTotal") or "MemAvailable" not in fields:
        return None
    return fields["MemAvailable"] / fields["MemTotal"]


def in_use_bytes(libc) -> int | None:
    """Bytes the program holds from malloc (heap chunks in use plus mmap'd blocks), or None without mallinfo2."""
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    info = fn()
    return info.uordblks + info.hblkhd


class Guard(threading.Thread):
    """Hands the heap's free pages back (`malloc_trim(0)`) whenever available memory is below `share` of the total,
    the process's resident memory has outgrown its recent peak in use (the bound in the module docstring), or it is
    above `ceiling` bytes (the ceiling, ibid.).

    A trim after which memory is still short handed back little: the memory is in use, not free in the heap, and
    trimming again at once would only cost page faults. So the wait before the next look doubles after each such
    trim (up to MAX_WAIT_S) and drops back to `interval` once memory is not short."""

    def __init__(self, libc, share: float, interval: float = GUARD_INTERVAL_S, bound: float | None = BOUND_SHARE,
                 ceiling: int | None = None):
        super().__init__(name="atom-heap-guard", daemon=True)
        self.libc, self.share, self.interval, self.bound, self.ceiling = libc, share, interval, bound, ceiling
        self.trims = 0
        self.bound_trims = 0   # of those, the trims for the bound (memory was not short)
        self.ceiling_trims = 0  # and those for the ceiling
        self.last_ceiling_trim: float | None = None
        self.recent: list[tuple[float, int]] = []  # (time, bytes in use), the last WINDOW_S seconds
        self.outside = 0  # resident bytes a bound trim could not hand back (code, Python's arenas): not the heap's
        self.last_bound_trim: float | None = None  # time.monotonic() of the last trim for the bound
        self.bounding = True  # False while run-all samples (unbounded())

    def over_bound(self) -> bool:
        """Is resident memory above the recent peak in use by more than the bound allows, with the last trim for
        the bound BOUND_COOLDOWN_S ago or more? The peak in use is sampled only while bounding."""
        if self.bound is None or not self.bounding:  # nothing to decide: no mallinfo2 walk of the arenas either
            return False
        used, rss = in_use_bytes(self.libc), resident_mb()
        if used is None or rss is None:
            return False
        now = time.monotonic()
        self.recent = [(t, b) for t, b in self.recent if now - t <= WINDOW_S] + [(now, used)]
        peak = max(b for _, b in self.recent)
        cooled = self.last_bound_trim is None or now - self.last_bound_trim >= BOUND_COOLDOWN_S
        return cooled and rss * 2**20 > peak * (1 + self.bound) + BOUND_MIN_BYTES + self.outside

    def over_ceiling(self) -> bool:
        """Is resident memory above the ceiling, with the last trim for it CEILING_COOLDOWN_S ago or more?"""
        if not self.ceiling:
            return False
        rss = resident_mb()
        if rss is None or rss * 2**20 <= self.ceiling:
            return False
        return self.last_ceiling_trim is None or time.monotonic() - self.last_ceiling_trim >= CEILING_COOLDOWN_S

    def trim_to_ceiling(self) -> None:
        """Trim for the ceiling; when what stays resident is near the ceiling, the memory is in use, not the heap's
        holes: lift the ceiling above it so the next looks do not trim pages about to be used again."""
        self.trim()
        self.ceiling_trims += 1
        self.last_ceiling_trim = time.monotonic()
        rss = resident_mb()
        if rss is not None and self.ceiling and rss * 2**20 > CEILING_NEAR * self.ceiling:
            self.ceiling = int(rss * 2**20 / CEILING_NEAR)

    def trim(self) -> None:
        self.trims += 1  # counted first: whoever sees the pages gone also sees the trim that handed them back
        self.libc.malloc_trim(0)  # ctypes drops the GIL for the call; glibc locks each arena itself

    def trim_to_bound(self) -> None:
        """Trim for the bound, and count what stayed resident beyond the heap's use as outside it from now on, so
        memory the heap does not own cannot make the guard trim at every look."""
        self.trim()
        self.bound_trims += 1
        self.last_bound_trim = time.monotonic()
        used, rss = in_use_bytes(self.libc), resident_mb()
        if used is not None and rss is not None:
            self.outside = max(self.outside, int(rss * 2**20) - used)

    def tick(self, wait: float) -> float:
        """Trim if memory is short or the heap is over its bound; returns how long to wait before the next look."""
        now = available_share()
        if now is None:
            return self.interval
        if now >= self.share:
            if self.over_bound():
                self.trim_to_bound()
            elif self.over_ceiling():
                self.trim_to_ceiling()
            return self.interval
        self.trim()
        after = available_share()
        return min(2 * wait, MAX_WAIT_S) if after is not None and after < self.share else self.interval

    def run(self) -> None:
        wait = self.interval
        while True:
            wait = self.tick(wait)
            time.sleep(wait)


guard: Guard | None = None  # the running guard, once retain() has started it


def resident_mb() -> float | None:
    """The process's resident size in MB (VmRSS), or None where /proc has none."""
    return _status_mb("VmRSS:")


def peak_resident_mb() -> float | None:
    """The process's largest resident size so far in MB (VmHWM), or None where /proc has none."""
    return _status_mb("VmHWM:")


def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


@contextlib.contextmanager
def unbounded():
    """No trims for the bound inside this block (the reserve and the ceiling still apply): what run-all does around
    its sampling stages (module docstring). Nothing to do without a running guard, and the bound stays where no
    ceiling limits the heap (ATOM_HEAP_CEILING=0, or a resumed run-all before its first training stage's check)."""
    g = guard
    if g is None or not g.ceiling:
        yield
        return
    before, g.bounding = g.bounding, False
    try:
        yield
    finally:
        g.bounding = before


def release() -> tuple[float | None, float | None]:
    """Hand the heap's free pages back now (`malloc_trim(0)` after a garbage collection); (resident MB before,
    after). run-all calls it before each training stage (the sampling's KV caches leave holes the training does not
    need) and after an in-process GRPO update (its freed activations leave holes sized for training batches). It
    hands pages back but cannot move what is still in use, so run-all trains its checkpoints in a child process
    (atomcli/stages/run_all/child.py)."""
    import gc
    before = resident_mb()
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    return before, resident_mb()


def start(command: str | None) -> bool:
    """What `atom COMMAND` does first: keep the heap where the policy says so (module docstring); True if kept."""
    chosen = policy()
    # a bad ATOM_HEAP_RESERVE, ATOM_HEAP_BOUND or ATOM_HEAP_CEILING is refused by every command, not only by those
    # that keep the heap
    reserve()
    bound_share()
    ceiling_gb()
    if chosen == RELEASE:
        return False
    if chosen == AUTO:
        if command not in TRAINING:
            return False
        import torch  # a training command imports it anyway; nothing large is allocated by the import
        if torch.cuda.is_available():
            return False
    return retain()


def retain() -> bool:
    """Serve all allocations from glibc's heap, never trim it on free, and start the guard that trims it while
    memory is short (module docstring); True if that was set. ATOM_HEAP=release turns it off."""
    global guard
    if policy() == RELEASE:
        return False
    share = reserve()
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success: True when glibc accepted both
    ok = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
    if ok and share > 0 and guard is None and available_share() is not None:
        fixed = ceiling_gb()
        guard = Guard(libc, share, bound=bound_share(), ceiling=int(fixed * 2**30) if fixed else None)
        guard.start()
    return ok
