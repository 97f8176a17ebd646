#!/bin/bash
# session 44: the `real` preset's two rounds keeping up to two right answers a question ([rft] per_question = 2)
# instead of one, on the very samples of runs/s43/real (both rounds' questions and rollouts hard-linked). Round 2's
# samples were drawn by session 43's rft-01, so that checkpoint and its evals are linked/copied as round 1's
# (rft-01 here is session 43's, not a tune on the per_question = 2 rows of round 1); run-all then keeps the rows again
# from the same rollouts, tunes round 2 from the SFT on both rounds' rows and evaluates rft-02.
set -euo pipefail
cd /work/main
S=runs/s43/real D=runs/s44/pq2
[ -f $S/rft/02/ckpt/config.json ] || { echo "no $S/rft/02/ckpt"; exit 1; }
[ ! -e $D ] || { echo "$D exists"; exit 1; }
pgrep -f "atomcli run-all" > /dev/null && { echo "another run-all is running"; exit 1; }
rm -rf /work/frozen_s44b && mkdir /work/frozen_s44b && git ls-files -z | xargs -0 -I{} cp --parents {} /work/frozen_s44b/
mkdir -p $D/eval/transfer $D/rft/01 $D/rft/02
cp -al $S/world $S/real $S/sft $D/
cp -al $S/rft/01/ckpt $D/rft/01/
for r in 01 02; do cp -l $S/rft/$r/questions.parquet $S/rft/$r/rollouts.parquet $D/rft/$r/; done
cp $S/atom_run.json $D/
cp $S/eval/questions.parquet $S/eval/sft.* $S/eval/rft-01.* $D/eval/
cp $S/eval/transfer/questions.parquet $S/eval/transfer/sft.* $S/eval/transfer/rft-01.* $D/eval/transfer/
sed -e "s#$S#$D#g" -e 's/"per_question": 1/"per_question": 2/' $S/config.json > $D/config.json
grep -q '"per_question": 2' $D/config.json
( while true; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg) $(free -m | awk '/Mem:/{print $3}')MB"; sleep 60; done ) > runs/s44/pq2_load.log 2>&1 &
LP=$!
export HF_HUB_OFFLINE=1
START=$(date +%s)
set +e
PYTHONPATH=/work/frozen_s44b /usr/bin/time -v .venv/bin/python -m atomcli run-all --demo --preset real --resume \
    --config bench/learning_runs/s44/pq2.toml --out $D > runs/s44/pq2.out 2> runs/s44/pq2.log
echo "RC $? minutes $(( ($(date +%s)-START)/60 ))" >> runs/s44/pq2.log
kill $LP
