#!/bin/bash
# session 44: a third rejection-sampling round of the `real` preset, resumed from runs/s43/real (session 42's SFT,
# session 43's rounds 1-2 at two samples a question). The world, the benchmark, the SFT and both rounds (their
# samples, kept rows and checkpoints) are hard-linked (every writer replaces files by rename, so the links are never
# written through); the evals are copied. config.json is s43's with rft_rounds = 3 and this folder's paths, so
# run-all skips everything done and runs round 3 only: it samples the real training questions rounds 1-2 left
# unsolved with rft-02, keeps the right answers, tunes the SFT one epoch on the rows of all three rounds and evaluates
# rft-03 (demo test 50, transfer 115).
set -euo pipefail
cd /work/main
S=runs/s43/real D=runs/s44/round3
[ -f $S/rft/02/ckpt/config.json ] || { echo "no $S/rft/02/ckpt"; exit 1; }
[ ! -e $D ] || { echo "$D exists"; exit 1; }
pgrep -f "atomcli run-all" > /dev/null && { echo "another run-all is running"; exit 1; }
rm -rf /work/frozen_s44 && mkdir /work/frozen_s44 && git ls-files -z | xargs -0 -I{} cp --parents {} /work/frozen_s44/
mkdir -p $D/eval/transfer $D/rft
cp -al $S/world $S/real $S/sft $D/
cp -al $S/rft/01 $S/rft/02 $D/rft/
cp $S/atom_run.json $D/
cp $S/eval/*.parquet $S/eval/*.json $D/eval/
cp $S/eval/transfer/* $D/eval/transfer/
sed -e "s#$S#$D#g" -e 's/"rft_rounds": 2/"rft_rounds": 3/' $S/config.json > $D/config.json
grep -q '"rft_rounds": 3' $D/config.json
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"; sleep 60; done ) > runs/s44/load.log 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
set +e
PYTHONPATH=/work/frozen_s44 /usr/bin/time -v .venv/bin/python -m atomcli run-all --demo --preset real --resume \
    --config bench/learning_runs/s44/round3.toml --out $D > runs/s44/round3.out 2> runs/s44/round3.log
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> runs/s44/round3.log
kill $LP
