#!/usr/bin/env bash
# Session 40: the learn preset from scratch with the policy sampling from a bf16 copy in batches of 50, and
# 8 steps of 8 questions (evals at 4 and 8) instead of 10 of 4 (issue 21's bar and 90-minute target).
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
while pgrep -f "chain_rft2.sh" >/dev/null; do sleep 20; done
echo "start $(date +%H:%M:%S)"
rm -rf runs/s40/learn
/usr/bin/time -v .venv/bin/atom run-all --demo --preset learn --out runs/s40/learn
echo "rc $? end $(date +%H:%M:%S)"
