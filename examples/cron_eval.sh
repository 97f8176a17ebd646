#!/usr/bin/env bash
# Nightly batch evaluation of a run's newest checkpoint, measured exactly as the run measures it
# (its questions, search, [rollout] and [eval] settings from RUN/config.json), appended to a time series.
# crontab:  0 3 * * *  cd /path/to/atomcli && RUN=runs/demo bash examples/cron_eval.sh >> runs/cron.log 2>&1
# Extra arguments go to `atom eval` (they override the run's settings, e.g. --limit 10 or --model PATH;
# a changed setting is reported as a new measurement in the history, never joined to the old curve).
# Each night writes RUN/cron/<time>.json, RUN/cron/latest.md, one line of RUN/cron/history.jsonl and the
# series drawn in RUN/cron/history.png (ΔF1 with paired 95% intervals). A night that overlaps the last
# one waits for it up to WAIT seconds, then stops with one line. Read the series any time with
#   atom eval --history RUN/cron/history.jsonl
set -euo pipefail
RUN=${RUN:-runs/demo}
WAIT=${WAIT:-600}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RUN/cron"
# Exit code 0 even when scores are low; 2 on bad input or a busy history (cron mails you the one-line error).
atom eval --run "$RUN" --wait "$WAIT" \
  --out "$RUN/cron/$STAMP.json" --markdown "$RUN/cron/latest.md" \
  --history "$RUN/cron/history.jsonl" --plot "$RUN/cron/history.png" "$@"
