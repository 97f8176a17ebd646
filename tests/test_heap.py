"""atomcli/heap.py: under `retain` a large freed block stays in the process's heap; under `release` glibc maps and
unmaps it (its default). Each case runs in a fresh interpreter: mallopt settings last for the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import FREED, HELD, atom

from atomcli import heap

def _has_mallinfo2() -> bool:
    libc = heap._glibc()
    return libc is not None and hasattr(libc, "mallinfo2")  # glibc 2.33 and later


# the policy is glibc's mallopt, and the probe reads glibc's counts with mallinfo2 (2.33+: older glibc has only
# mallinfo, whose int fields overflow at 2 GiB)
needs_glibc = pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc 2.33+ (mallopt and mallinfo2)")

# malloc and free 256 MiB (written, so its pages are real), then report glibc's own counts (mallinfo2, glibc 2.33+):
# `hblkhd` is memory held in mmap'd blocks (counted from before the malloc: startup maps a few), `arena` the heap's size, `fordblks` its free bytes.
PROBE = r"""
import ctypes, json
from atomcli import heap
set_ = heap.retain()
libc = heap._glibc()  # its mallinfo2 returns heap._MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
before = libc.mallinfo2()
p = libc.malloc(size)
ctypes.memset(p, 1, size)
held = libc.mallinfo2()
libc.free(p)
freed = libc.mallinfo2()
print(json.dumps({"set": set_, "held_mmap": held.hblkhd - before.hblkhd, "freed_arena": freed.arena, "freed_free": freed.fordblks}))
"""
MIB = 1 << 20


def run_probe(code: str, env: dict, *args: str) -> dict:
    """Run a probe script in a fresh interpreter (mallopt settings last for the process) and read its JSON line."""
    out = subprocess.run([sys.executable, "-c", code, *args], env=dict(os.environ, **env), capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def probe(policy: str) -> dict:
    return run_probe(PROBE, {heap.ENV: policy})


@needs_glibc
def test_retain_keeps_a_freed_block_in_the_heap():
    got = probe(heap.RETAIN)
    assert got["set"] is True
    assert got["held_mmap"] == 0                    # served from the heap, not a fresh mapping
    assert got["freed_arena"] >= 256 * MIB          # and after free the heap still holds it, free for the next step
    assert got["freed_free"] >= 256 * MIB


@needs_glibc
def test_release_is_glibcs_default_a_mapping_returned_on_free():
    got = probe(heap.RELEASE)
    assert got["set"] is False
    assert got["held_mmap"] >= 256 * MIB            # a block this large is its own mapping
    assert got["freed_arena"] < 64 * MIB            # unmapped on free: the next step's pages are new (and zeroed)


def test_a_policy_that_does_not_exist_is_a_one_line_error(tmp_path):
    proc = atom("show", tmp_path / "none.parquet", env={heap.ENV: "keep-it-all"})
    err = proc.stderr.decode()
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0
    assert "ATOM_HEAP='keep-it-all' is not a heap policy" in err and "retain, release" in err


# malloc, write and free 256 MiB under `retain`, then wait for the guard's ticks: resident memory before the free and
# after it, and how many times the guard trimmed
GUARD_PROBE = HELD.format(setup="", size=256 << 20) + FREED.format(drop_mb=200) + r"""
print(json.dumps({"held": held, "after": after, "trims": heap.guard.trims if heap.guard else None}))
"""


def guard_probe(share: str) -> dict:
    return run_probe(GUARD_PROBE, {heap.ENV: heap.RETAIN, heap.RESERVE_ENV: share})


@needs_glibc
@pytest.mark.skipif(heap.available_share() is None, reason="the guard reads /proc/meminfo")
def test_the_guard_hands_free_pages_back_only_while_memory_is_short():
    short = guard_probe("0.999")    # available memory is always below 99.9% of the total: memory counts as short
    assert short["trims"] >= 1
    assert short["held"] - short["after"] >= 200           # MB: the freed block's pages left the process
    plenty = guard_probe("0")       # 0: no guard, the retained heap keeps its pages
    assert plenty["trims"] is None
    assert plenty["held"] - plenty["after"] < 64          # MB


def test_a_reserve_that_is_not_a_share_is_a_one_line_error(tmp_path):
    proc = atom("show", tmp_path / "none.parquet", env={heap.RESERVE_ENV: "20%"})
    err = proc.stderr.decode()
    assert proc.returncode == 2
    assert err.strip().count("\n") == 0
    assert "ATOM_HEAP_RESERVE='20%' is not a share of memory" in err


class CountingLibc:
    """Stands in for glibc: counts the trims."""
    def __init__(self):
        self.trims = 0

    def malloc_trim(self, pad):
        self.trims += 1
        return 1


def test_the_guard_backs_off_while_trims_leave_memory_short(monkeypatch):
    """A trim that leaves memory short doubles the wait (up to MAX_WAIT_S); one that relieves it resets the wait."""
    shares = iter([])
    monkeypatch.setattr(heap, "available_share", lambda: next(shares))
    guard = heap.Guard(CountingLibc(), share=0.2, interval=0.5)

    shares = iter([0.1, 0.1])   # short before the trim and after it: the memory is in use
    assert guard.tick(0.5) == 1.0
    shares = iter([0.1, 0.1])
    assert guard.tick(8.0) == heap.MAX_WAIT_S
    shares = iter([0.1, 0.1])
    assert guard.tick(heap.MAX_WAIT_S) == heap.MAX_WAIT_S
    shares = iter([0.1, 0.5])   # the trim handed back enough
    assert guard.tick(heap.MAX_WAIT_S) == 0.5
    shares = iter([0.5])        # not short: no trim
    assert guard.tick(4.0) == 0.5
    assert guard.libc.trims == guard.trims == 4


class FakeLibc(CountingLibc):
    """glibc with `mallinfo2` reporting what the test sets as in use."""
    def __init__(self):
        super().__init__()
        self.used = 0

    def mallinfo2(self):
        return heap._MallInfo2(uordblks=self.used)


def test_the_guard_trims_a_heap_that_outgrew_its_recent_peak_in_use(monkeypatch):
    """Memory is plentiful, but resident memory above the recent peak in use (times 1 + BOUND_SHARE, plus
    BOUND_MIN_BYTES) is a heap of holes: the guard trims it. A peak still inside the window keeps the heap, and
    a trim for the bound waits BOUND_COOLDOWN_S after the last one."""
    gib = 1 << 30
    clock = [0.0]
    rss_mb = [0.0]
    monkeypatch.setattr(heap, "available_share", lambda: 0.9)
    monkeypatch.setattr(heap, "resident_mb", lambda: rss_mb[0])
    monkeypatch.setattr(heap.time, "monotonic", lambda: clock[0])
    libc = FakeLibc()
    guard = heap.Guard(libc, share=0.2, interval=0.5)

    libc.used, rss_mb[0] = 8 * gib, 9 * 1024             # a training step: 8 GiB in use, 9 resident
    assert guard.tick(0.5) == 0.5 and libc.trims == 0
    clock[0], libc.used = 60.0, 2 * gib                   # between steps: the freed pages stay resident
    assert guard.tick(0.5) == 0.5 and libc.trims == 0     # the peak 60 s ago still counts: they will be reused
    clock[0] = 60.0 + heap.WINDOW_S                       # no step that large for a whole window
    assert guard.tick(0.5) == 0.5 and libc.trims == 1 and guard.bound_trims == 1
    # the fake trim hands nothing back: 7 GiB resident with 2 in use counts as outside the heap from now on
    assert guard.outside == 7 * gib
    limit_mb = (2 * (1 + heap.BOUND_SHARE) * gib + heap.BOUND_MIN_BYTES + guard.outside) / 2**20
    rss_mb[0] = limit_mb - 1                              # within the bound: kept
    assert guard.tick(0.5) == 0.5 and libc.trims == 1
    rss_mb[0] = limit_mb + 1
    assert guard.tick(0.5) == 0.5 and libc.trims == 1     # over the bound, but within the cooldown of the last trim
    clock[0] += heap.BOUND_COOLDOWN_S - 1
    assert guard.tick(0.5) == 0.5 and libc.trims == 1
    clock[0] += 1
    assert guard.tick(0.5) == 0.5 and libc.trims == 2
    clock[0] += heap.BOUND_COOLDOWN_S
    assert guard.tick(0.5) == 0.5 and libc.trims == 2     # what that trim left is outside too: no trim at every look


def test_unbounded_lifts_only_the_bound_while_sampling(monkeypatch):
    """run-all samples inside `heap.unbounded()`: a heap over its bound is kept there and trimmed after it, and
    memory that runs short is still handed back. Without a ceiling the bound is not lifted."""
    gib = 1 << 30
    share = [0.9]
    monkeypatch.setattr(heap, "available_share", lambda: share[0])
    monkeypatch.setattr(heap, "resident_mb", lambda: 12 * 1024)  # 12 GiB resident, 1 GiB in use: over the bound
    libc = FakeLibc()
    libc.used = gib
    guard = heap.Guard(libc, share=0.2, interval=0.5)
    monkeypatch.setattr(heap, "guard", guard)
    with heap.unbounded():
        assert guard.bounding                              # no ceiling: the bound is all that limits the heap
    guard.ceiling = 20 * gib
    with heap.unbounded():
        assert guard.tick(0.5) == 0.5 and libc.trims == 0
        share[0] = 0.1                                     # short of memory: the reserve still trims
        guard.tick(0.5)
        assert libc.trims == 1 and guard.bound_trims == 0
        share[0] = 0.9
    assert guard.bounding
    guard.tick(0.5)
    assert libc.trims == 2 and guard.bound_trims == 1


def test_run_all_samples_without_the_bound(monkeypatch, tmp_path):
    """Run.rollout_stage (run-all's rollouts and evals) runs inside heap.unbounded() (under a ceiling)."""
    from atomcli.stages import rollout_io
    from atomcli.stages.run_all.runner import Run
    guard = heap.Guard(CountingLibc(), share=0.2, ceiling=1 << 30)
    monkeypatch.setattr(heap, "guard", guard)
    seen = []
    monkeypatch.setattr(rollout_io, "run_to_file", lambda *a, **k: seen.append(guard.bounding))
    runner = Run.__new__(Run)
    runner.follow, runner.out = None, tmp_path
    runner.log = lambda msg: None
    runner.read = lambda path, stage: None
    runner.ctx = None
    Run.rollout_stage(runner, SimpleNamespace(model="m"), tmp_path / "q.parquet", tmp_path / "r.parquet")
    assert seen == [False] and guard.bounding


def test_the_ceiling_trims_resident_memory_above_it_at_most_once_per_cooldown(monkeypatch):
    """Memory is plentiful and the bound is off: resident memory above the ceiling is trimmed at once, bound lifted
    or not, then not again within CEILING_COOLDOWN_S."""
    gib = 1 << 30
    clock, rss_mb = [0.0], [9 * 1024.0]
    monkeypatch.setattr(heap, "available_share", lambda: 0.9)
    monkeypatch.setattr(heap, "resident_mb", lambda: rss_mb[0])
    monkeypatch.setattr(heap.time, "monotonic", lambda: clock[0])
    libc = FakeLibc()
    guard = heap.Guard(libc, share=0.2, bound=None, ceiling=10 * gib)
    monkeypatch.setattr(heap, "guard", guard)
    assert guard.tick(0.5) == 0.5 and libc.trims == 0          # 9 GiB under a 10 GiB ceiling
    real_trim = guard.trim
    monkeypatch.setattr(guard, "trim", lambda: (real_trim(), rss_mb.__setitem__(0, 4 * 1024.0)))  # hands holes back
    rss_mb[0] = 11 * 1024.0
    with heap.unbounded():                                      # sampling in run-all: the ceiling still holds
        assert guard.tick(0.5) == 0.5 and libc.trims == 1 and guard.ceiling_trims == 1
    rss_mb[0] = 11 * 1024.0                                     # the holes are back within a few steps
    clock[0] += heap.CEILING_COOLDOWN_S - 1
    guard.tick(0.5)
    assert libc.trims == 1                                      # over it, within the cooldown...
    clock[0] += 1
    guard.tick(0.5)
    assert libc.trims == 2 and guard.ceiling == 10 * gib        # ...and trimmed again once it is over


def test_a_ceiling_below_what_is_in_use_follows_it_instead_of_trimming_at_every_look(monkeypatch):
    """A trim that leaves resident memory near the ceiling found memory in use, not holes (the estimate was low
    for this process): the ceiling is lifted above it."""
    gib = 1 << 30
    rss_mb = [12 * 1024.0]
    monkeypatch.setattr(heap, "available_share", lambda: 0.9)
    monkeypatch.setattr(heap, "resident_mb", lambda: rss_mb[0])
    guard = heap.Guard(FakeLibc(), share=0.2, bound=None, ceiling=10 * gib)
    guard.tick(0.5)
    assert guard.ceiling_trims == 1 and guard.ceiling == int(12 * gib / heap.CEILING_NEAR)
    guard.last_ceiling_trim = None                              # no cooldown: the lifted ceiling alone keeps it
    guard.tick(0.5)
    assert guard.ceiling_trims == 1
    holes = heap.Guard(FakeLibc(), share=0.2, bound=None, ceiling=20 * gib)
    rss_mb[0] = 21 * 1024.0
    real_trim = holes.trim
    monkeypatch.setattr(holes, "trim", lambda: (real_trim(), rss_mb.__setitem__(0, 5 * 1024.0)))
    holes.tick(0.5)                                             # this trim handed 16 GiB of holes back
    assert holes.ceiling_trims == 1 and holes.ceiling == 20 * gib


def test_a_training_stages_memory_check_raises_the_ceiling_unless_the_variable_fixes_it(monkeypatch, tiny_model):
    import transformers

    from atomcli.train import memory
    monkeypatch.setenv(memory.SKIP_ENV, "0")
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    guard = heap.Guard(CountingLibc(), share=0.2)
    monkeypatch.setattr(heap, "guard", guard)
    monkeypatch.delenv(heap.CEILING_ENV, raising=False)
    memory.check_training("sft", model, batch_rows=2, tokens_per_row=256, checkpointing=False, hint="h")
    need = memory.training_bytes(memory.Shape.of(model), batch_rows=2, tokens_per_row=256, checkpointing=False)
    assert guard.ceiling == need > 0
    memory.check_training("sft", model, batch_rows=1, tokens_per_row=256, checkpointing=False, hint="h")
    assert guard.ceiling == need                                # a smaller stage later in the process keeps it
    memory.check_training("sft", model, batch_rows=8, tokens_per_row=256, checkpointing=False, hint="h")
    assert guard.ceiling > need                                 # a larger one raises it
    guard.ceiling = 5 << 30                                     # as retain() sets it from ATOM_HEAP_CEILING=5
    monkeypatch.setenv(heap.CEILING_ENV, "5")
    memory.check_training("sft", model, batch_rows=4, tokens_per_row=256, checkpointing=False, hint="h")
    assert guard.ceiling == 5 << 30


def test_a_bad_ceiling_is_a_one_line_error_and_zero_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv(heap.CEILING_ENV, "0")
    assert heap.ceiling_gb() == 0
    monkeypatch.setenv(heap.CEILING_ENV, "12.5")
    assert heap.ceiling_gb() == 12.5
    proc = atom("show", tmp_path / "none.parquet", env={heap.CEILING_ENV: "12GB"})
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.strip().count("\n") == 0
    assert "ATOM_HEAP_CEILING='12GB' is not a number of gigabytes" in err


# under `retain`, memory plentiful, the bound off: a 512 MiB block freed below a live 64 MiB one is a hole the next,
# larger block cannot reuse; resident memory (hole + blocks) then exceeds a 1 GiB ceiling, unless it is 0
CEILING_PROBE = HELD.format(setup="", size=512 << 20) + r"""
pin = libc.malloc(64 << 20)
ctypes.memset(pin, 1, 64 << 20)
libc.free(p)
q = libc.malloc(600 << 20)
ctypes.memset(q, 1, 600 << 20)
deadline = time.monotonic() + 10  # the guard looks twice a second; a loaded machine may keep its thread waiting
while heap.guard.ceiling_trims == 0 and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"after": heap.resident_mb(), "ceiling_trims": heap.guard.ceiling_trims,
                  "ceiling": heap.guard.ceiling}))
"""


@needs_glibc
@pytest.mark.skipif(heap.available_share() is None, reason="the guard reads /proc/meminfo")
@pytest.mark.parametrize("ceiling, trimmed", [("1", True), ("0", False)])
def test_the_ceiling_hands_back_a_hole_that_put_resident_memory_above_it(ceiling, trimmed):
    got = run_probe(CEILING_PROBE, {heap.ENV: heap.RETAIN, heap.RESERVE_ENV: "1e-9", heap.BOUND_ENV: "0",
                                    heap.CEILING_ENV: ceiling})
    assert (got["ceiling_trims"] >= 1) is trimmed, got
    # MB: hole and blocks (512 + 64 + 600 and the interpreter) stay resident above the ceiling, or the hole left
    assert (got["after"] < 1024) is trimmed, got
    if trimmed:
        assert got["ceiling"] == 2**30                      # the hole, not memory in use: the ceiling stays


def test_without_mallinfo2_the_guard_only_watches_available_memory(monkeypatch):
    monkeypatch.setattr(heap, "available_share", lambda: 0.9)
    monkeypatch.setattr(heap, "resident_mb", lambda: 1e9)
    guard = heap.Guard(CountingLibc(), share=0.2)
    assert guard.tick(0.5) == 0.5 and guard.trims == 0


def test_a_bound_of_zero_turns_it_off_and_a_bad_one_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv(heap.BOUND_ENV, "0")
    assert heap.bound_share() is None
    monkeypatch.setattr(heap, "available_share", lambda: 0.9)
    monkeypatch.setattr(heap, "resident_mb", lambda: 1e9)
    libc = FakeLibc()
    guard = heap.Guard(libc, share=0.2, bound=heap.bound_share())
    assert guard.tick(0.5) == 0.5 and libc.trims == 0     # far over any bound, and no trim
    monkeypatch.delenv(heap.BOUND_ENV)
    assert heap.bound_share() == heap.BOUND_SHARE
    proc = atom("show", tmp_path / "none.parquet", env={heap.BOUND_ENV: "a lot"})
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.strip().count("\n") == 0
    assert "ATOM_HEAP_BOUND='a lot' is not a share of the peak in use" in err


# under `retain`, with memory plentiful (a reserve of 1e-9): hold 512 MiB long enough for the guard to see it in use,
# free it, and wait; a short window lets the peak expire, a long one keeps it
BOUND_PROBE = HELD.format(setup="heap.WINDOW_S, heap.BOUND_MIN_BYTES = float(sys.argv[1]), 64 << 20",
                          size=512 << 20) + r"""
time.sleep(1.2)  # the guard looks twice a second
held = heap.resident_mb()
libc.free(p)
time.sleep(2.5)
print(json.dumps({"held": held, "after": heap.resident_mb(), "bound_trims": heap.guard.bound_trims}))
"""


@needs_glibc
@pytest.mark.skipif(heap.available_share() is None, reason="the guard reads /proc/meminfo")
@pytest.mark.parametrize("window, trimmed", [(1.0, True), (60.0, False)])
def test_the_bound_hands_back_holes_only_after_their_peak_left_the_window(window, trimmed):
    got = run_probe(BOUND_PROBE, {heap.ENV: heap.RETAIN, heap.RESERVE_ENV: "1e-9"}, str(window))
    assert (got["bound_trims"] >= 1) is trimmed
    assert (got["held"] - got["after"] >= 400) is trimmed   # MB: the 512 MiB block's pages left the process, or not


# under `retain` with no guard (reserve 0) a freed 256 MiB block stays resident until `release()` hands it back
RELEASE_PROBE = HELD.format(setup="", size=256 << 20) + r"""
libc.free(p)
before, after = heap.release()
print(json.dumps({"before": before, "after": after}))
"""


@needs_glibc
def test_release_hands_a_kept_heap_back_at_once():
    """run-all calls release() after a training stage (the stage's heap of holes is of no use to sampling)."""
    got = run_probe(RELEASE_PROBE, {heap.ENV: heap.RETAIN, heap.RESERVE_ENV: "0"})
    assert got["before"] - got["after"] >= 200  # MB: the freed block left the process


def test_the_heap_is_kept_only_for_cpu_training_unless_asked(monkeypatch):
    import torch
    calls = []
    monkeypatch.setattr(heap, "retain", lambda: calls.append(1) or True)
    monkeypatch.delenv(heap.ENV, raising=False)
    for command in ("eval", "rollout", "index", "show", None):
        assert heap.start(command) is False  # evals, rollouts and indexes keep glibc's defaults
    assert heap.start("sft") is (not torch.cuda.is_available())  # a GPU run keeps them too
    monkeypatch.setenv(heap.ENV, "retain")
    assert heap.start("eval") is True        # opt in for any command
    monkeypatch.setenv(heap.ENV, "release")
    assert heap.start("sft") is False        # opt out for training
    assert len(calls) == 1 + (not torch.cuda.is_available())
