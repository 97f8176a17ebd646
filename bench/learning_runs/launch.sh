#!/bin/bash
# The launch part every learning-run arm shares (sessions 42-44 repeated it in each script): refuse to start beside
# another run-all, freeze a copy of the committed code so edits made during the run cannot reach it, log the load
# and used memory every minute, run `atom run-all` under /usr/bin/time -v, and end its log with an RC line.
# An arm script prepares its run folder (hard links, config.json) and then calls:
#
#   bench/learning_runs/launch.sh NAME LOGDIR -- RUN-ALL ARGS...
#
# NAME names the frozen copy (/work/frozen_NAME) and the logs: LOGDIR/NAME.log (stderr, ends with "RC <code>
# minutes <m>"), LOGDIR/NAME.out (stdout: the run's summary) and LOGDIR/NAME_load.log.
set -euo pipefail
[ $# -ge 3 ] && [ "$3" = "--" ] || { echo "usage: $0 NAME LOGDIR -- RUN-ALL ARGS..." >&2; exit 2; }
NAME=$1 LOGDIR=$2
shift 3
cd "$(dirname "$0")/../.."
pgrep -f "atomcli run-all" > /dev/null && { echo "another run-all is running" >&2; exit 1; }
FROZEN=/work/frozen_$NAME
rm -rf "$FROZEN" && mkdir "$FROZEN" && git ls-files -z | xargs -0 -I{} cp --parents {} "$FROZEN/"
mkdir -p "$LOGDIR"
[ ! -e "$LOGDIR/$NAME.log" ] || { echo "$LOGDIR/$NAME.log exists: pick another NAME (a resumed run gets its own logs)" >&2; exit 1; }
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"
  sleep 60; done ) > "$LOGDIR/${NAME}_load.log" 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
set +e
PYTHONPATH=$FROZEN /usr/bin/time -v .venv/bin/python -m atomcli run-all "$@" > "$LOGDIR/$NAME.out" 2> "$LOGDIR/$NAME.log"
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> "$LOGDIR/$NAME.log"
kill $LP
