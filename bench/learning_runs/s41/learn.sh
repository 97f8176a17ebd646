#!/usr/bin/env bash
# Session 41: the learn preset as changed this session (SFT, then one rejection-sampling round on the demo
# training questions; no GRPO steps), from scratch, seed 0, alone (issue 21's bar and 90-minute target).
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
while pgrep -f "rft_arm.sh" >/dev/null; do sleep 10; done
echo "start $(date +%H:%M:%S)"
/usr/bin/time -v .venv/bin/atom run-all --demo --preset learn --out runs/s41/learn
echo "rc $? end $(date +%H:%M:%S)"
