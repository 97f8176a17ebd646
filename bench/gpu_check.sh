#!/usr/bin/env bash
# GPU check: rollout and grpo-step tokens/s, MFU and peak memory in bf16 for a random-init
# Qwen2.5-1.5B-shaped policy on one CUDA device (bench/gpu_check.py has the details).
# Nothing is downloaded; under 8 minutes on one GPU. Results: stdout, and a Markdown fragment
# for bench/RESULTS.md's GPU section at $OUT/gpu_check.md, else bench/gpu_check.md (or --out FILE).
#
#   bash bench/gpu_check.sh               # needs a CUDA device; fails at once without one
#   bash bench/gpu_check.sh --cpu-smoke   # the same code path with a tiny model on the CPU
#
# PYTHON picks the interpreter (default: .venv/bin/python, else python3); GPU_CHECK_TIMEOUT
# (seconds, default 470) caps the whole run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

smoke=0
for a in "$@"; do [ "$a" = "--cpu-smoke" ] && smoke=1; done
if [ "$smoke" = 0 ]; then
  # checked before transformers and the model load (one torch import): a machine without a GPU answers in seconds
  "$PY" - <<'PY' || exit 3
import sys
try:
    import torch
except ImportError as e:
    sys.exit(f"gpu_check: torch is not importable ({e}); set PYTHON to an interpreter that has atomcli installed")
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}). Run it on a GPU "
             "machine, or pass --cpu-smoke to run the same code path on the CPU.")
PY
fi
exec timeout "${GPU_CHECK_TIMEOUT:-470}" "$PY" bench/gpu_check.py "$@"
