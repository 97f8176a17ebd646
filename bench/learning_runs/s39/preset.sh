#!/usr/bin/env bash
# Session 39: the learn preset from scratch with the retained heap, its guard with back-off , SFT batches of 2 rows x 2 accumulated, padded to a multiple of 256 tokens (issue 21's 90-minute target).
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
echo "start $(date +%H:%M:%S)"
rm -rf runs/s39/learn
/usr/bin/time -v .venv/bin/atom run-all --demo --preset learn --out runs/s39/learn
echo "rc $? end $(date +%H:%M:%S)"
