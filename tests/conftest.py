"""Shared fixtures: offline mode, the tiny random model, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def atom(*args, input: bytes | str | None = None, env: dict | None = None, timeout: float = 600,
         check: bool = False) -> subprocess.CompletedProcess:
    """Run `atom ARGS` in a subprocess (the real entry point), returning bytes stdout/stderr."""
    if isinstance(input, str):
        input = input.encode()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "atomcli", *map(str, args)], input=input,
                          capture_output=True, env=full_env, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"atom {' '.join(map(str, args))} exited {proc.returncode}:\n"
                             f"{proc.stderr.decode(errors='replace')[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer, hidden-64 random Llama with SmolLM2's tokenizer and chat template."""
    from atomcli import models
    return models.make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


# What the heap probes (tests/test_heap.py, tests/test_sysmem.py) start with, run as `python -c` in a fresh
# interpreter: the kept heap, glibc's malloc and free, and `size` bytes written at `p`.
HELD = r"""
import ctypes, json, os, sys, time
from atomcli import heap
{setup}
heap.retain()
libc = heap._glibc()
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = {size}
p = libc.malloc(size)
ctypes.memset(p, 1, size)
"""

# ...then free the block and wait for `drop_mb` MB of it to leave the process (the guard's trim) or for a deadline:
# the guard looks twice a second, backs off up to MAX_WAIT_S while trims leave memory short, and on a loaded machine
# its thread may wait its turn; without a guard there is nothing to wait for. `held` and `after` are VmRSS in MB.
FREED = r"""
held = heap.resident_mb()
libc.free(p)
deadline = time.monotonic() + heap.MAX_WAIT_S + 4
while heap.guard and held - heap.resident_mb() < {drop_mb} and time.monotonic() < deadline:
    time.sleep(0.1)
after = heap.resident_mb()
"""
