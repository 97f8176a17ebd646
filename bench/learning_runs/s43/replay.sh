#!/bin/bash
# session 43, after go.sh: round 1 of runs/s43/real again, its tune on the kept rows plus as many of the
# expert's rows (rft_replay = 1.0), through run-all's own resume: the world, the SFT, its evals and round 1's
# questions, samples and kept rows are hard-linked from runs/s43/real, so run-all only writes tune.parquet,
# tunes from the SFT and evaluates rft-01 (demo test 50, transfer 115).
set -euo pipefail
cd /work/main
S=runs/s43/real D=runs/s43/replay
[ -f $S/rft/02/ckpt/config.json ] || { echo "go.sh has not finished ($S/rft/02/ckpt)"; exit 1; }
[ ! -e $D ] || { echo "$D exists"; exit 1; }
rm -rf /work/frozen_s43b && mkdir /work/frozen_s43b && git ls-files -z | xargs -0 -I{} cp --parents {} /work/frozen_s43b/
mkdir -p $D/eval/transfer $D/rft/01
cp -al $S/world $S/real $S/sft $D/
cp $S/atom_run.json $D/
cp $S/eval/questions.parquet $S/eval/sft.json $S/eval/sft.parquet $D/eval/
cp $S/eval/transfer/questions.parquet $S/eval/transfer/sft.json $S/eval/transfer/sft.parquet $D/eval/transfer/
cp $S/rft/01/questions.parquet $S/rft/01/rollouts.parquet $S/rft/01/kept.parquet $S/rft/01/rows.parquet $D/rft/01/
sed -e 's#runs/s43/real#runs/s43/replay#g' -e 's/"rft_rounds": 2/"rft_rounds": 1/' \
    -e 's/"rft_lr": 0.0001/"rft_lr": 0.0001,\n    "rft_replay": 1.0/' $S/config.json > $D/config.json
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"; sleep 60; done ) > runs/s43/replay_load.log 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
set +e
PYTHONPATH=/work/frozen_s43b /usr/bin/time -v .venv/bin/python -m atomcli run-all --demo --preset real --resume \
    --config bench/learning_runs/s43/replay.toml --out $D > runs/s43/replay.out 2> runs/s43/replay.log
RC=$?
echo "RC $RC minutes $(( ($(date +%s)-START)/60 ))" >> runs/s43/replay.log
kill $LP
