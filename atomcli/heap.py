"""The process's heap policy: keep freed memory in the process instead of handing it back to the system.

Why: a CPU training step allocates and frees the same large tensors (logits of 49,152 columns per token, activations)
every step. glibc serves each allocation over 32 MB with a fresh `mmap` and unmaps it when freed, so every step the
kernel hands out new pages and zeroes them again. On the 2-core VM of session 37, `perf` put 90% of an SFT's time in
the kernel's page zeroing (`clear_page_erms`), and a step took about 60 s instead of about 20 s. With `retain()` glibc
serves every allocation from its heap (no `mmap`) and never trims it, so a freed tensor's pages are reused as they
are (in the main thread's arena, where CPU autograd allocates; thread arenas still map and unmap); the resident size never
shrinks and can grow with fragmentation (an SFT's went from 13 to 20.7 GB) (`bench/heap.py` measures both
ways side by side).

`atom` calls `retain()` when it starts, before torch allocates anything. `ATOM_HEAP=release` keeps glibc's defaults
(a process that must hand memory back while it waits); other C libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "ATOM_HEAP"
RETAIN, RELEASE = "retain", "release"
CHOICES = (RETAIN, RELEASE)
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
# mallopt takes an int and glibc stores the trim threshold as a size_t: -1 becomes SIZE_MAX, "never trim"
# (the largest positive int would still hand back all free top-of-heap over 2 GiB, every step)
NEVER_TRIM = -1


def _glibc():
    """glibc's handle, or None on another C library."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def policy() -> str:
    """The heap policy ATOM_HEAP asks for (retain by default); a value not in CHOICES is an error."""
    from atomcli.errors import InputError
    value = os.environ.get(ENV, RETAIN).strip().lower() or RETAIN
    if value not in CHOICES:
        raise InputError(f"{ENV}={value!r} is not a heap policy", hint=f"use one of: {', '.join(CHOICES)}")
    return value


def retain() -> bool:
    """Serve all allocations from glibc's heap and never trim it (module docstring); True if that was set."""
    if policy() != RETAIN:
        return False
    libc = _glibc()
    if libc is None:
        return False
    # mallopt returns 1 on success: True when glibc accepted both
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM))
