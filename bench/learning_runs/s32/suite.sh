#!/bin/bash
# session 32: the README's test command on this commit, alone after chain1 (a first, niced start beside chain1's SFT
# was stopped: it halved the SFT's rate), then let chain2 start
cd /work/main
while ! grep -q "CHAIN1 DONE" runs/s32/chain1.log; do sleep 15; done
date
git log --oneline | head -1
HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider 2>&1 | tail -30
echo "rc=${PIPESTATUS[0]}"
while ! grep -q "CHAIN1 DONE" runs/s32/chain1.log; do sleep 15; done
date
touch runs/s32/go2
echo SUITE DONE
