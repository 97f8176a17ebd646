#!/bin/bash
# the full suite alone, after chain2 (no model job beside it)
cd /work/main
while ! grep -q "CHAIN2 DONE" runs/s33/chain2.log; do sleep 20; done
date
git log --oneline | head -1
HF_HUB_OFFLINE=1 .venv/bin/python -m pytest -q -p no:cacheprovider 2>&1 | tail -15
echo "rc=${PIPESTATUS[0]}"
date
echo SUITE DONE
