#!/usr/bin/env bash
# Session 41: the learn preset's SFT (session 40's checkpoint) + one rejection-sampling round on the demo
# training questions instead of GRPO steps (issue 21), alone on the machine.
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
echo "start $(date +%H:%M:%S)"
SFT_FROM=runs/s40/learn RUNS=runs/s41/arms ARMS=rft /usr/bin/time -v bench/learning.sh
echo "rc $? end $(date +%H:%M:%S)"
