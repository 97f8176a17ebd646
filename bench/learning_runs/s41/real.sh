#!/usr/bin/env bash
# Session 41: `atom run-all --demo --preset real` from scratch, seed 0, alone (issue 20's first whole-preset measurement).
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
echo "start $(date +%H:%M:%S)"
/usr/bin/time -v .venv/bin/atom run-all --demo --preset real --out runs/s41/real
echo "rc $? end $(date +%H:%M:%S)"
