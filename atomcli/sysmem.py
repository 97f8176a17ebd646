"""How much memory this process's machine has, and how much of it is available: /proc/meminfo, narrowed by the
memory limit of the process's control group (cgroup v1 or v2) where it has one. Also a child cgroup with a memory
limit, for the tests and benchmarks that run a command as on a smaller machine.

A container, a Slurm job or a systemd unit often gets less memory than the host has; /proc/meminfo still shows
the host. A run that trusted it would pass the memory check and keep its heap until the cgroup's limit killed it.
So the total is the tightest limit on the way from the process's cgroup up to the root of the mount, and what is
available there is that limit minus the cgroup's usage, plus its inactive file pages (page cache the kernel drops
before it reclaims anything of ours, as MemAvailable counts it).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

PROC_MEMINFO = "/proc/meminfo"
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number


def meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable in bytes, each at most what the process's cgroup allows (what is there of them;
    empty where there is no /proc/meminfo)."""
    fields = host_meminfo()
    limit = cgroup_memory()
    if limit is not None and fields:
        total, available = limit
        fields["MemTotal"] = min(fields.get("MemTotal", total), total)
        if "MemAvailable" in fields:
            fields["MemAvailable"] = min(fields["MemAvailable"], available)
    return fields


def host_meminfo() -> dict[str, int]:
    """MemTotal and MemAvailable from /proc/meminfo in bytes (what is there of them; empty where there is none)."""
    fields = {}
    try:
        with open(PROC_MEMINFO, encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    fields[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return fields


def cgroup_memory() -> tuple[int, int] | None:
    """(limit, available) in bytes over the process's cgroup and its ancestors: the smallest limit and the least
    memory available under any of them (a child's limit and its parent's usage can each be the tighter); None where
    no cgroup limits this process or none can be read. Never raises: the heap guard's thread calls it."""
    try:
        got = [x for x in (_limit_and_available(f, v2) for f, v2 in _cgroup_folders()) if x is not None]
    except (OSError, ValueError):
        return None
    return (min(x[0] for x in got), min(x[1] for x in got)) if got else None


def own_cgroup() -> tuple[Path, bool] | None:
    """The process's own memory cgroup folder and whether it is cgroup v2, or None where there is none to read."""
    try:
        folders = _cgroup_folders()
    except (OSError, ValueError):
        return None
    return folders[0] if folders else None


def _cgroup_folders() -> list[tuple[Path, bool]]:
    """The memory cgroup folders from the process's own up to the mount's root, each with whether it is cgroup v2.

    /proc/self/cgroup names the cgroup from the root of the hierarchy, but inside a container the mount's root is
    often the container's own cgroup, so the folder is the longest tail of that path that exists under the mount.
    Each folder on the way up is read, whether or not the process's own one has a limit file (under v2 a parent
    may limit memory without handing that control down)."""
    try:
        lines = Path(PROC_CGROUP).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            root, v2 = Path(CGROUP_ROOT) / "memory", False
        elif parts[0] == "0" and parts[1] == "":
            root, v2 = Path(CGROUP_ROOT), True
            if not (root / "cgroup.controllers").exists():
                root = root / "unified"  # hybrid layout: v2 mounted beside the v1 controllers
        else:
            continue
        if not root.is_dir():
            continue
        names = [p for p in parts[2].split("/") if p not in ("", ".", "..")]
        for start in range(len(names) + 1):
            folder = root.joinpath(*names[start:])
            if folder.is_dir():
                return [(root.joinpath(*names[start:start + n]), v2) for n in range(len(names) - start, -1, -1)]
    return []


def _limit_and_available(folder: Path, v2: bool) -> tuple[int, int] | None:
    """(limit, limit - usage + inactive file pages) of one cgroup folder; None without a limit or readable files."""
    try:
        raw = (folder / ("memory.max" if v2 else "memory.limit_in_bytes")).read_text(encoding="ascii").strip()
        if raw == "max" or int(raw) >= UNLIMITED:
            return None
        limit = int(raw)
        usage = int((folder / ("memory.current" if v2 else "memory.usage_in_bytes")).read_text(encoding="ascii"))
        stat = dict(line.split()[:2] for line in
                    (folder / "memory.stat").read_text(encoding="ascii").splitlines() if line.strip())
        inactive = int(stat.get("inactive_file" if v2 else "total_inactive_file", stat.get("inactive_file", 0)))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return limit, max(0, min(limit, limit - usage + inactive))


def describe() -> str:
    """Where a message's figure of available memory comes from: "within its cgroup's limit of N GB" or "of the
    machine's N GB"."""
    limit = cgroup_memory()
    host = host_meminfo().get("MemTotal")
    if limit is not None and (host is None or limit[0] < host):
        return f"within its cgroup's limit of {limit[0] / 2**30:.1f} GB"
    return f"of the machine's {host / 2**30:.1f} GB" if host else "of the machine's memory"


def limited_cgroup(limit: int, prefix: str = "atom") -> Path | None:
    """A fresh memory cgroup limited to `limit` bytes (a process joins it by writing its pid to `cgroup.procs`), or
    None where this process may not make one (not root, a read-only mount, no memory controller)."""
    own = own_cgroup()
    if own is None:
        return None
    folder, v2 = own
    # under v2 a cgroup that holds processes cannot hand memory control to a child: try beside it too
    for parent in (folder, folder.parent) if v2 else (folder,):
        child = parent / f"{prefix}-{uuid.uuid4().hex[:8]}"
        try:
            child.mkdir()
        except OSError:
            continue
        try:
            (child / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
            return child
        except OSError:
            remove_cgroup(child)
    return None


def remove_cgroup(folder: Path, wait: float = 5.0) -> None:
    """Remove an empty cgroup; its last process may take a moment to leave it after exiting."""
    deadline = time.monotonic() + wait
    while True:
        try:
            folder.rmdir()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
