#!/bin/bash
# session 43: the `real` preset (two samples a question, two rounds) resumed from session 42's SFT
# (runs/s42/real/sft, seed 0; its world, benchmark and SFT evals hard-linked into runs/s43/real, config.json
# the preset's with these paths). Everything after the SFT runs here, from a frozen copy of the code.
cd /work/main
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"; sleep 60; done ) > runs/s43/load.log 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
PYTHONPATH=/work/frozen_s43 /usr/bin/time -v .venv/bin/python -m atomcli run-all --demo --preset real --resume --out runs/s43/real > runs/s43/real.out 2> runs/s43/real.log
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> runs/s43/real.log
kill $LP
