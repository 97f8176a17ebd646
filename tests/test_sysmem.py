"""atomcli/sysmem.py: the memory a process has is its cgroup's limit where that is tighter than the machine.

Fake /proc and /sys trees check the rules (v1 and v2, nested limits, a container's namespaced path, no limit);
where this machine lets a test make a cgroup (root, cgroup v1 or v2 writable), a real child cgroup checks that
the heap guard and the memory check see its limit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FREED, HELD

from atomcli import sysmem
from atomcli.errors import InputError
from atomcli.train import memory

GIB = 1 << 30


def fake(monkeypatch, tmp_path: Path, cgroup_line: str, folders: dict[str, dict[str, str]], *,
         v2: bool, total: int = 24 * GIB, available: int = 20 * GIB) -> Path:
    """A fake /proc/meminfo, /proc/self/cgroup and cgroup mount with `folders` (path under the mount: files)."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {total // 1024} kB\nMemFree: 1 kB\nMemAvailable: {available // 1024} kB\n")
    (tmp_path / "cgroup").write_text(cgroup_line + "\n")
    mount = tmp_path / "sys"
    root = mount if v2 else mount / "memory"
    root.mkdir(parents=True)
    if v2:
        (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, files in folders.items():
        folder = root / rel
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
    monkeypatch.setattr(sysmem, "PROC_MEMINFO", str(meminfo))
    monkeypatch.setattr(sysmem, "PROC_CGROUP", str(tmp_path / "cgroup"))
    monkeypatch.setattr(sysmem, "CGROUP_ROOT", str(mount))
    return root


def v2_files(limit: str, current: int, inactive: int) -> dict[str, str]:
    return {"memory.max": limit, "memory.current": str(current), "memory.stat": f"anon 1\ninactive_file {inactive}\n"}


def test_a_v2_limit_on_a_parent_narrows_total_and_available(monkeypatch, tmp_path):
    """A Slurm-like job (limit 4 GiB) with a step inside it (no limit of its own): the step sees the job's limit,
    and what is available there is the limit minus the usage plus the inactive file pages."""
    fake(monkeypatch, tmp_path, "0::/job/step", {
        "job": v2_files(str(4 * GIB), 3 * GIB, GIB // 2),
        "job/step": v2_files("max", 3 * GIB, GIB // 2)}, v2=True)
    assert sysmem.meminfo() == {"MemTotal": 4 * GIB, "MemAvailable": GIB + GIB // 2}
    assert sysmem.describe() == "within its cgroup's limit of 4.0 GB"


@pytest.mark.parametrize("parent, child, expected", [
    ((8, 2), (3, 2), (3, 1)),    # the child's limit is both the smaller and the tighter
    ((8, 7), (4, 1), (4, 1)),    # the child's limit is the smaller; the parent's usage leaves less available
])
def test_nested_limits_give_the_smallest_limit_and_the_least_available(monkeypatch, tmp_path, parent, child,
                                                                        expected):
    fake(monkeypatch, tmp_path, "0::/a/b", {
        "a": v2_files(str(parent[0] * GIB), parent[1] * GIB, 0),
        "a/b": v2_files(str(child[0] * GIB), child[1] * GIB, 0)}, v2=True)
    assert sysmem.meminfo() == {"MemTotal": expected[0] * GIB, "MemAvailable": expected[1] * GIB}


def test_a_parents_limit_counts_when_the_own_cgroup_has_no_memory_files(monkeypatch, tmp_path):
    """Under v2 a parent can limit memory without handing that control down to the process's own cgroup."""
    fake(monkeypatch, tmp_path, "0::/job/step", {"job": v2_files(str(4 * GIB), GIB, 0), "job/step": {}}, v2=True)
    assert sysmem.meminfo() == {"MemTotal": 4 * GIB, "MemAvailable": 3 * GIB}


def test_a_v1_limit_seen_from_inside_a_container(monkeypatch, tmp_path):
    """/proc/self/cgroup names the host's path; the container's mount has the cgroup at its root."""
    fake(monkeypatch, tmp_path, "4:memory:/docker/0123abcd", {
        ".": {"memory.limit_in_bytes": str(2 * GIB), "memory.usage_in_bytes": str(GIB + GIB // 4),
              "memory.stat": f"cache 9\ntotal_inactive_file {GIB // 4}\n"}}, v2=False)
    assert sysmem.meminfo() == {"MemTotal": 2 * GIB, "MemAvailable": GIB}


@pytest.mark.parametrize("v2, files", [
    (True, v2_files("max", 5 * GIB, 0)),
    (False, {"memory.limit_in_bytes": "9223372036854771712", "memory.usage_in_bytes": str(5 * GIB),
             "memory.stat": "total_inactive_file 0\n"}),
])
def test_no_limit_leaves_the_machines_figures(monkeypatch, tmp_path, v2, files):
    fake(monkeypatch, tmp_path, "0::/u" if v2 else "4:memory:/u", {"u": files}, v2=v2)
    assert sysmem.meminfo() == {"MemTotal": 24 * GIB, "MemAvailable": 20 * GIB}
    assert sysmem.describe() == "of the machine's 24.0 GB"


def test_a_limit_above_the_machine_does_not_raise_its_figures(monkeypatch, tmp_path):
    fake(monkeypatch, tmp_path, "0::/u", {"u": v2_files(str(64 * GIB), GIB, 0)}, v2=True)
    assert sysmem.meminfo() == {"MemTotal": 24 * GIB, "MemAvailable": 20 * GIB}


@pytest.mark.parametrize("files", [
    {"memory.max": "not a number"},
    {**v2_files(str(4 * GIB), GIB, 0), "memory.stat": "inactive_file lots\n"},
    {**v2_files(str(4 * GIB), GIB, 0), "memory.current": ""},
])
def test_unreadable_cgroup_files_leave_the_machines_figures(monkeypatch, tmp_path, files):
    fake(monkeypatch, tmp_path, "0::/u", {"u": files}, v2=True)
    assert sysmem.meminfo() == {"MemTotal": 24 * GIB, "MemAvailable": 20 * GIB}


def test_the_memory_check_refuses_within_the_cgroup_and_says_so(monkeypatch, tmp_path):
    monkeypatch.delenv(memory.CAP_ENV, raising=False)
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    fake(monkeypatch, tmp_path, "0::/job", {"job": v2_files(str(4 * GIB), 3 * GIB, 0)}, v2=True)
    monkeypatch.setattr("atomcli.heap.resident_mb", lambda: 512.0)   # the process holds 0.5 GiB of the 3
    with pytest.raises(InputError) as err:
        memory.check_fits("sft", 2 * GIB, "lower --batch-size")
    assert "2.0 GB of memory and 1.5 GB is available (within its cgroup's limit of 4.0 GB)" in str(err.value)
    memory.check_fits("sft", GIB, "x")   # fits within the limit: no error


# --- a real cgroup --------------------------------------------------------------------------------------------------

@pytest.fixture
def cgroup_1g():
    made = sysmem.limited_cgroup(GIB, "atomtest")
    if made is None:
        pytest.skip("this machine does not let the test make a memory cgroup")
    yield made
    sysmem.remove_cgroup(made)


def run_in(cgroup: Path, code: str, env: dict) -> dict:
    """Run `code` in a fresh interpreter that joins `cgroup` before it starts, and read its JSON line."""
    cmd = f'echo $$ > "{cgroup}/cgroup.procs" && exec "{sys.executable}" -c "$0"'
    base = {k: v for k, v in os.environ.items() if k not in (memory.CAP_ENV, memory.SKIP_ENV)}
    out = subprocess.run(["sh", "-c", cmd, code], env=dict(base, **env), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# under the kept heap, hold and free 850 MiB inside a 1 GiB cgroup on a machine with far more: the freed pages leave
# the heap only if the guard's reserve (20% available) is counted within the cgroup's limit
GUARD_PROBE = HELD.format(setup="from atomcli import sysmem", size=850 << 20) + FREED.format(drop_mb=700) + r"""
print(json.dumps({"total": sysmem.meminfo()["MemTotal"], "held": held, "after": after, "trims": heap.guard.trims}))
"""


@pytest.mark.skipif(sysmem.host_meminfo().get("MemTotal", 0) < 4 * GIB, reason="needs a machine larger than 4 GiB")
def test_in_a_real_cgroup_the_guard_hands_the_heap_back_within_its_limit(cgroup_1g):
    from atomcli import heap
    got = run_in(cgroup_1g, GUARD_PROBE, {heap.ENV: heap.RETAIN, heap.BOUND_ENV: "0"})
    assert got["total"] == GIB
    assert got["trims"] >= 1
    assert got["held"] - got["after"] >= 700   # MB: the freed block's pages left the process


CHECK_PROBE = r"""
import json
from atomcli.errors import InputError
from atomcli.train import memory
try:
    memory.check_fits("sft", 2 << 30, "lower --batch-size")
    print(json.dumps({"refused": ""}))
except InputError as e:
    print(json.dumps({"refused": str(e)}))
"""


def test_in_a_real_cgroup_the_memory_check_counts_its_limit(cgroup_1g):
    got = run_in(cgroup_1g, CHECK_PROBE, {})
    assert "needs about 2.0 GB" in got["refused"] and "within its cgroup's limit of 1.0 GB" in got["refused"]
