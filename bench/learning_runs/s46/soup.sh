#!/bin/bash
# session 46: model soups of the `real` preset's tunes (bench/learning_runs/s46/soup.py), each evaluated on the demo
# test (50) and transfer (115) splits exactly as run-all evaluates (`atom eval --config examples/real.toml`, greedy,
# seed 0; session 42's world and SQLite indexes, runs/s43/real), compared with seed 0's SFT, written where arms.py
# reads them: runs/s46/soups/NAME/eval/{,transfer/}NAME.json. SOUPS (from the environment) lists NAME=CKPT,CKPT,...
# entries separated by spaces; the default is the three soups of session 46:
#   s0r12   seed 0's two rounds (runs/s43/real rft-01 and rft-02, both tuned from its SFT)
#   s01r2   the final round of each seed (seed 0: runs/s43/real rft-02; seed 1: runs/s45/real1 rft-02)
#   s0all   every tune of seed 0's SFT measured in sessions 43-45 (the two rounds, two answers a question, the
#           third round, the replay, the contrast arm): no choice among them, all weighted alike
set -euo pipefail
cd "$(dirname "$0")/../../.."
S=runs/s43/real
T=runs/s43/real/rft R=runs/s44
DEFAULT="s0r12=$T/01/ckpt,$T/02/ckpt s01r2=$T/02/ckpt,runs/s45/real1/rft/02/ckpt \
s0all=$T/01/ckpt,$T/02/ckpt,$R/pq2/rft/02/ckpt,$R/round3/rft/03/ckpt,runs/s43/replay/rft/01/ckpt,runs/s45/contrast/ckpt"
export S SOUPS=${SOUPS:-$DEFAULT}
for soup in $SOUPS; do
  for c in $(tr ',' ' ' <<< "${soup#*=}"); do [ -f "$c/model.safetensors" ] || { echo "no $c/model.safetensors"; exit 1; }; done
  [ ! -e "runs/s46/soups/${soup%%=*}" ] || { echo "runs/s46/soups/${soup%%=*} exists"; exit 1; }
done
exec bench/learning_runs/launch.sh "${NAME:-s46soup}" runs/s46 -- bash -c '
set -e
for soup in $SOUPS; do
  name=${soup%%=*} D=runs/s46/soups/${soup%%=*}
  mkdir -p $D/eval/transfer
  .venv/bin/python $FROZEN/bench/learning_runs/s46/soup.py --out $D/ckpt $(tr "," " " <<< "${soup#*=}")
  for split in transfer ""; do
    if [ "$split" = transfer ]; then search=local:$S/real/index.sqlite; else search=local:$S/world/index.sqlite; fi
    .venv/bin/python -m atomcli eval $S/eval/$split/questions.parquet --model $D/ckpt --search $search \
        --config examples/real.toml --answers $D/eval/$split/$name.parquet -o $D/eval/$split/$name.json \
        --compare $S/eval/$split/sft.json
  done
done'
