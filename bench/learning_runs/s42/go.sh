#!/bin/bash
cd /work/main
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"; sleep 60; done ) > runs/s42/load.log 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
PYTHONPATH=/work/frozen_s42 /usr/bin/time -v .venv/bin/python -m atomcli run-all --demo --preset real --out runs/s42/real > runs/s42/real.out 2> runs/s42/real.log
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> runs/s42/real.log
kill $LP
