"""run-all's training stages in a child process: the same checkpoint as in-process, errors that come back as they
are, and no child left training after its run-all is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from atomcli import envelope, heap
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import sft
from atomcli.stages.run_all import child

ROWS = [{"messages": [{"role": "user", "content": f"Question {i}?"},
                      {"role": "assistant", "content": f"<answer>{i}</answer>"}]} for i in range(4)]


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return data


def _cfg(model, steps: int = 2) -> sft.SFTConfig:
    return sft.SFTConfig(model=str(model), max_steps=steps, batch_size=2, lr=1e-3, gradient_checkpointing=False,
                         precision="fp32")


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(ckpt / "model.safetensors"))


def test_the_child_trains_the_checkpoint_the_process_itself_would(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data, cfg = _data(tmp_path), _cfg(tiny_model)
    got = child.train("sft", sft, cfg, data, tmp_path / "child", Context(quiet=True))
    envelope.table_to_checkpoint("sft", sft, cfg, str(data), str(tmp_path / "here"), Context(quiet=True))
    assert got["pid"] != os.getpid()
    a, b = _weights(tmp_path / "child"), _weights(tmp_path / "here")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert set(got) >= {"ceiling", "trims", "bound_trims", "ceiling_trims", "resident_mb", "peak_mb"}
    assert got["peak_mb"] >= got["resident_mb"] > 0  # the child's own figures (VmHWM, VmRSS), not this process's


def test_an_input_error_comes_back_as_the_same_one_line(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "no messages here"}) + "\n")
    cfg = _cfg(tiny_model)
    with pytest.raises(InputError) as here:
        envelope.table_to_checkpoint("sft", sft, cfg, str(bad), str(tmp_path / "here"), Context(quiet=True))
    with pytest.raises(InputError) as there:
        child.train("sft", sft, cfg, bad, tmp_path / "child", Context(quiet=True))
    assert str(there.value) == str(here.value) and str(bad) in str(there.value)
    assert not (tmp_path / "child").exists()


def test_a_failure_in_the_child_is_an_error_with_its_traceback(tmp_path):
    nowhere = types.ModuleType("atomcli_no_such_stage")  # the child cannot import it
    with pytest.raises(child.StageFailed, match="^sft failed in its child process: ModuleNotFoundError") as e:
        child.train("sft", nowhere, None, tmp_path / "in", tmp_path / "out", Context(quiet=True))
    assert "\n" not in str(e.value)  # one line; the child's whole traceback is the cause
    assert isinstance(e.value.__cause__, child.ChildTraceback) and "Traceback" in str(e.value.__cause__)


class _KilledOnArrival:
    """Unpickled in the child before its stage starts: the child dies of SIGKILL, as the OOM killer would do it."""

    def __reduce__(self):
        return signal.raise_signal, (signal.SIGKILL,)


def test_a_child_killed_by_a_signal_is_an_error_that_says_so(tmp_path):
    with pytest.raises(child.StageFailed, match=r"sft's child process was killed by signal 9 \(SIGKILL\).*dmesg"):
        child.train("sft", sft, _KilledOnArrival(), tmp_path / "in", tmp_path / "out", Context(quiet=True))
    assert not (tmp_path / "out").exists()


TRAIN_FOREVER = """
import sys
from pathlib import Path
from atomcli.context import Context
from atomcli.stages import sft
from atomcli.stages.run_all import child
cfg = sft.SFTConfig(model=sys.argv[1], max_steps=100000, batch_size=2, lr=1e-3, gradient_checkpointing=False,
                    precision="fp32")
child.train("sft", sft, cfg, Path(sys.argv[2]), Path(sys.argv[3]), Context(quiet=True))
"""


def _children(pid: int) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(d.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_run_all_leaves_no_child_training_into_its_folder(tiny_model, tmp_path):
    out = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", TRAIN_FOREVER, str(tiny_model), str(_data(tmp_path)), str(out)],
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    kids: list[int] = []
    while not kids and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
        kids = _children(proc.pid)
    assert kids, f"no child started: {proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ''}"
    time.sleep(3)  # well inside its training (100,000 steps)
    assert all(_alive(k) for k in kids)
    proc.kill()
    proc.wait()
    deadline = time.time() + 30
    while any(_alive(k) for k in kids) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(k) for k in kids), "the training child outlived its run-all"
    assert not (out / "config.json").exists()


def test_run_all_adopts_the_childs_ceiling_for_its_sampling(tiny_model, tmp_path, monkeypatch):
    """The training stage's memory check ran in the child; the parent's guard takes its estimate as before."""
    from atomcli.stages.run_all.runner import Run
    monkeypatch.setattr(heap, "guard", heap.Guard(None, share=0.2))
    monkeypatch.setattr(child, "train", lambda *a: {"pid": 1, "ceiling": 5 * 2**30, "trims": 3, "bound_trims": 1,
                                                    "ceiling_trims": 2, "resident_mb": 900.0,
                                                    "peak_mb": 2500.0})
    logged = []
    run = types.SimpleNamespace(ctx=Context(quiet=True), out=tmp_path, log=logged.append,
                                release_heap=lambda: None)
    Run.train_stage(run, "sft", sft, _cfg(tiny_model), tmp_path / "in", tmp_path / "ckpt")
    assert heap.guard.ceiling == 5 * 2**30
    assert "trained in a child process (its heap guard trimmed 3 times: 1 for its bound, 2 for its ceiling; " \
        "resident at its peak 2,500 MB, at its end 900 MB; this process " in logged[-1]


def test_a_script_that_calls_it_without_a_main_guard_runs_once(tiny_model, tmp_path):
    """The child is its own program: the caller's script is not run again in it (multiprocessing's spawn would)."""
    script = tmp_path / "mine.py"
    script.write_text(TRAIN_FOREVER.replace("max_steps=100000", "max_steps=1") + "print('top level ran')\n")
    r = subprocess.run([sys.executable, str(script), str(tiny_model), str(_data(tmp_path)), str(tmp_path / "ckpt")],
                       capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("top level ran") == 1 and (tmp_path / "ckpt" / "config.json").exists()
