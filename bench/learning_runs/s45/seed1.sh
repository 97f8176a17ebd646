#!/bin/bash
# session 45: the `real` preset from scratch with seed 1 (the SFT's order and the rounds' samples; the world and the
# SQLite benchmark are built with their own fixed seed, so they are session 42's bytes). Session 42-44 measured seed
# 0 (SFT 0.254, two rounds 0.274-0.278); seed 1's hand-run chain of sessions 36-40 reached 0.300. This measures the
# preset's second seed as one command. About 64 minutes of SFT and 120 of rounds: more than one session, so the next
# session continues it with `NAME=s46 bench/learning_runs/s45/seed1.sh --resume` (its own logs, under runs/s46).
set -euo pipefail
cd "$(dirname "$0")/../../.."
NAME=${NAME:-s45}
exec bench/learning_runs/launch.sh "$NAME" "runs/$NAME" -- .venv/bin/python -m atomcli run-all --demo --preset real --config bench/learning_runs/s45/seed1.toml --out runs/s45/real1 "$@"
