#!/bin/bash
# session 45 (written to run in session 46): the contrast arm, bench/learning_runs/s45/contrast.py. From session 42's
# SFT checkpoint (runs/s43/real/sft, hard-linked there from runs/s42/real), GRPO updates on round 1's own samples
# (session 43: two a question at 0.7, seed 0, from that SFT), right answers against wrong ones to the same question,
# then the demo test (50) and transfer (115) evals exactly as run-all runs them (`atom eval --config
# examples/real.toml`: its [rollout] and [eval] sections, greedy, seed 0), written where arms.py reads them:
# runs/s46/contrast/eval/{,transfer/}contrast.json. Compare against round 1's tune on the right answers alone:
#   python bench/learning_runs/s44/arms.py runs/s46/contrast:contrast=runs/s43/real:rft-01 \
#       runs/s46/contrast:contrast=runs/s43/real:sft
# LR, NGROUPS and EPOCHS from the environment (defaults 2e-5, the learn preset's GRPO rate, measured stable in
# sessions 23-40; 2 questions an update; 1 pass; session 45 ran the defaults); LAST_TURN=1 trains the last assistant
# turn only (contrast.py --last-turn); NAME names the logs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
S=runs/s43/real D=${D:-runs/s46/contrast} NAME=${NAME:-s46c} LR=${LR:-2e-5} NGROUPS=${NGROUPS:-2} EPOCHS=${EPOCHS:-1} LAST_TURN=${LAST_TURN:+--last-turn}
[ -f $S/sft/config.json ] && [ -f $S/rft/01/rollouts.parquet ] || { echo "no $S/sft or its round-1 rollouts"; exit 1; }
[ ! -e $D ] || { echo "$D exists"; exit 1; }
mkdir -p $D/eval/transfer
export S D LR NGROUPS EPOCHS LAST_TURN
exec bench/learning_runs/launch.sh "$NAME" "$(dirname $D)" -- bash -c '
set -e
.venv/bin/python $FROZEN/bench/learning_runs/s45/contrast.py --rollouts $S/rft/01/rollouts.parquet \
    --model $S/sft --out $D --lr $LR --groups $NGROUPS --epochs $EPOCHS $LAST_TURN
for split in transfer ""; do
  if [ "$split" = transfer ]; then search=local:$S/real/index.sqlite; else search=local:$S/world/index.sqlite; fi
  .venv/bin/python -m atomcli eval $S/eval/$split/questions.parquet --model $D/ckpt --search $search \
      --config examples/real.toml --answers $D/eval/$split/contrast.parquet -o $D/eval/$split/contrast.json \
      --compare $S/eval/$split/sft.json
done'
