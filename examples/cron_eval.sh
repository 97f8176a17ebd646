#!/usr/bin/env bash
# Nightly batch evaluation of the newest checkpoint, appending to a time series.
# crontab:  0 3 * * *  cd /path/to/atomcli && bash examples/cron_eval.sh >> runs/cron.log 2>&1
set -euo pipefail
RUN=${RUN:-runs/demo}
QUESTIONS=${QUESTIONS:-$RUN/world/test.jsonl}
SEARCH=${SEARCH:-local:$RUN/world/index.sqlite}
CKPT=$(ls -d "$RUN"/steps/*/ckpt 2>/dev/null | sort | tail -n 1)
CKPT=${CKPT:-smollm2}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RUN/cron"
# Exit code 0 even when scores are low; 2 on bad input (cron mails you the one-line error).
atom eval "$QUESTIONS" --model "$CKPT" --search "$SEARCH" --limit 50 \
  --out "$RUN/cron/$STAMP.json" --markdown "$RUN/cron/latest.md" --history "$RUN/cron/history.jsonl"
