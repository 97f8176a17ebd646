"""bench/gpu_check.sh: it refuses at once without a CUDA device, and its CPU smoke runs the GPU code path.

These tests live with the benchmark suite (nothing under tests/ depends on bench/); pytest collects them with the
rest (`testpaths` in pyproject.toml), or alone: `.venv/bin/python -m pytest bench/tests`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _gpu_check(*args, env=None):
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env=full, timeout=120, cwd=ROOT, check=False)


def test_gpu_check_fails_fast_without_a_device():
    proc = _gpu_check()
    assert proc.returncode == 3
    assert "no CUDA device" in proc.stderr and "--cpu-smoke" in proc.stderr


def test_gpu_check_cpu_smoke_runs_the_same_code_path(tmp_path):
    from atomcli import models
    models.ensure_demo_model()  # the check's tokenizer; converted here, outside the subprocess's time limit
    proc = _gpu_check("--cpu-smoke", env={"OUT": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| rollout, HF engine |" in text
    for precision in ("bf16", "fp32"):  # grpo-step --precision: the GPU default, the CPU default
        assert f"| grpo-step update | --precision {precision} |" in text
    assert "Failed" not in text
