#!/bin/bash
# session 43: round 1's tune (runs/s43/real/rft/01/rows.parquet, 164 rows, from the SFT) in a fresh process with
# the run's settings, stopped after 13 steps: its progress lines against the run's own (real.log) for the same
# batches (the same seed and rows; step 1 trains at lr 0 in both, so step 2's loss must agree)
cd /work/main
export HF_HUB_OFFLINE=1
rm -rf /tmp/fresh_tune
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done ) > runs/s43/fresh_tune_load.log 2>&1 &
LP=$!
PYTHONPATH=/work/frozen_s43 .venv/bin/python -m atomcli sft runs/s43/real/rft/01/rows.parquet --model runs/s43/real/sft \
    --out /tmp/fresh_tune --lr 1e-4 --epochs 1 --max-steps 13 --sampling random --batch-size 2 --grad-accum 2 \
    --max-length 2048 --warmup-ratio 0.1 --no-gradient-checkpointing --precision bf16 --seed 0 2> runs/s43/fresh_tune.log
kill $LP
