#!/usr/bin/env bash
# Session 38: the learn preset from scratch with the retained heap (issue 21's 90-minute target).
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
echo "start $(date +%H:%M:%S)"
/usr/bin/time -v .venv/bin/atom run-all --demo --preset learn --out runs/s38/learn
echo "rc $? end $(date +%H:%M:%S)"
