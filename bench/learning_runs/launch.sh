#!/bin/bash
# The launch part every learning-run arm shares (sessions 42-44 repeated it in each script): refuse to start beside
# another model job, freeze a copy of the committed code so edits made during the run cannot reach it, log the load
# and used memory every minute, run the job under /usr/bin/time -v, and end its log with an RC line.
# An arm script prepares its run folder (hard links, config.json) and then calls:
#
#   bench/learning_runs/launch.sh NAME LOGDIR -- COMMAND ARGS...    e.g.  -- .venv/bin/python -m atomcli run-all ...
#
# The job runs with the frozen copy first on PYTHONPATH and its folder in $FROZEN: a chain of commands passes
# `bash -c '...'` and names bench scripts as $FROZEN/bench/... (single quotes: expanded when the job runs). NAME names the frozen copy
# (/work/frozen_NAME) and the logs: LOGDIR/NAME.log (stderr, ends with "RC <code> minutes <m>"), LOGDIR/NAME.out
# (stdout) and LOGDIR/NAME_load.log. A later job with the same NAME is refused: a resumed run gets its own logs.
set -euo pipefail
[ $# -ge 4 ] && [ "$3" = "--" ] || { echo "usage: $0 NAME LOGDIR -- COMMAND ARGS..." >&2; exit 2; }
NAME=$1 LOGDIR=$2
shift 3
cd "$(dirname "$0")/../.."
pgrep -f "^[^ ]*python[^ ]* .*(atomcli run-all|learning_runs/)" > /dev/null && { echo "another model job is running" >&2; exit 1; }
mkdir -p "$LOGDIR"
[ ! -e "$LOGDIR/$NAME.log" ] || { echo "$LOGDIR/$NAME.log exists: pick another NAME" >&2; exit 1; }
export FROZEN=/work/frozen_$NAME
rm -rf "$FROZEN" && mkdir "$FROZEN" && git ls-files -z | xargs -0 -I{} cp --parents {} "$FROZEN/"
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"
  sleep 60; done ) > "$LOGDIR/${NAME}_load.log" 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
set +e
PYTHONPATH=$FROZEN /usr/bin/time -v "$@" > "$LOGDIR/$NAME.out" 2> "$LOGDIR/$NAME.log"
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> "$LOGDIR/$NAME.log"
kill $LP
