"""How much memory this process's machine has, and how much of it is available: /proc/meminfo, narrowed by the
memory limit of the process's control group (cgroup v1 or v2) where it has one.

A container, a Slurm job or a systemd unit often gets less memory than the host has; /proc/meminfo still shows
the host. A run that trusted it would pass the memory check and keep its heap until the cgroup's limit killed it.
So the total is the tightest limit on the way from the process's cgroup up to the root of the mount, and what is
available there is that limit minus the cgroup's usage, plus its inactive file pages (page cache the kernel drops
before it reclaims anything of ours, as MemAvailable counts it).
"""

from __future__ import annotations

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
    """(limit, available) in bytes of the tightest memory limit over the process's cgroup and its ancestors, or None
    where no cgroup limits this process (or none can be read)."""
    best = None
    for folder, v2 in _cgroup_folders():
        got = _limit_and_available(folder, v2)
        if got is not None and (best is None or got[1] < best[1]):
            best = got
    return best


def own_cgroup() -> tuple[Path, bool] | None:
    """The process's own memory cgroup folder and whether it is cgroup v2, or None where there is none to read."""
    folders = _cgroup_folders()
    return folders[0] if folders else None


def _cgroup_folders() -> list[tuple[Path, bool]]:
    """The memory cgroup folders from the process's own up to the mount's root, each with whether it is cgroup v2.

    /proc/self/cgroup names the cgroup from the root of the hierarchy, but inside a container the mount's root is
    often the container's own cgroup, so the longest tail of that path that exists under the mount is the folder."""
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
        names = [p for p in parts[2].split("/") if p]
        for start in range(len(names) + 1):
            folder = root.joinpath(*names[start:])
            if folder.is_dir() and _has_limit_file(folder, v2):
                chain = [folder]
                while chain[-1] != root:
                    chain.append(chain[-1].parent)
                return [(f, v2) for f in chain]
    return []


def _has_limit_file(folder: Path, v2: bool) -> bool:
    return (folder / ("memory.max" if v2 else "memory.limit_in_bytes")).exists()


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
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    inactive = int(stat.get("inactive_file" if v2 else "total_inactive_file", stat.get("inactive_file", 0)))
    return limit, max(0, min(limit, limit - usage + inactive))


def describe() -> str:
    """'the cgroup's limit of N GB' or 'the machine's N GB': for messages that say what memory there is."""
    limit = cgroup_memory()
    host = host_meminfo().get("MemTotal")
    if limit is not None and (host is None or limit[0] < host):
        return f"its cgroup's limit of {limit[0] / 2**30:.1f} GB"
    return f"the machine's {host / 2**30:.1f} GB" if host else "the machine's memory"

