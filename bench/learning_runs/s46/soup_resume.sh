#!/bin/bash
# session 46: run-all's own rft_soup path on seed 1's finished run. runs/s46/real1soup is a hard-linked copy of
# runs/s45/real1 (SFT, both rounds, their evals) whose config.json gained `rft_soup = true`, the preset's new
# setting and whose recorded paths name the copy (run-all records its world's paths; the first launch, s46rs, was
# refused for them, naming each); `--resume` with the preset as it is now redoes nothing but the soup: it averages the two rounds'
# checkpoints into rft/soup/ckpt and evaluates it as rft-soup (demo test and transfer). Its transfer eval should
# equal soup.sh's s1r12 (0.314), the same average evaluated by `atom eval --config examples/real.toml`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
exec bench/learning_runs/launch.sh "${NAME:-s46rs2}" runs/s46 -- .venv/bin/python -m atomcli run-all --demo --preset real \
    --config bench/learning_runs/s45/seed1.toml --out runs/s46/real1soup --resume
