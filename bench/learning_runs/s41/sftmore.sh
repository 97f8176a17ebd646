#!/usr/bin/env bash
# Session 41: the control for the `rft` arm (issue 21): the same one-epoch tune from the learn preset's SFT
# checkpoint (lr 1e-4, random order, the [sft] section's other settings), on the 200 expert rows instead of the
# policy's own right answers. Does the round's gain come from its data or from more training?
set -uo pipefail
cd /work/main
export HF_HUB_OFFLINE=1 THP_MEM_ALLOC_ENABLE=1
while pgrep -f "rft_arm.sh|s41/learn.sh|pytest" >/dev/null; do sleep 10; done
A=.venv/bin/atom; R=runs/s41/sftmore; S=runs/s40/learn; CFG=runs/s41/learn_eval.toml
mkdir -p $R
echo "sft start $(date +%H:%M:%S)"
$A sft $S/world/sft.parquet --model $S/sft --out $R/ckpt --lr 1e-4 --epochs 1 --max-steps 0 --sampling random \
   --batch-size 2 --grad-accum 2 --max-length 2048 --warmup-ratio 0.1 --no-gradient-checkpointing --precision bf16 \
   --seed 0 || exit 1
echo "eval start $(date +%H:%M:%S)"
$A eval $S/eval/questions.parquet --model $R/ckpt --search local:$S/world/index.sqlite --config $CFG \
   --compare $S/eval/sft.json -o $R/test.json --answers $R/test.parquet || exit 1
echo "dev start $(date +%H:%M:%S)"
$A eval runs/s41/arms/rft/eval/dev/questions.parquet --model $R/ckpt --search local:$S/world/index.sqlite --config $CFG \
   --compare runs/s41/arms/rft/eval/dev/sft.json -o $R/dev.json --answers $R/dev.parquet
echo "end $(date +%H:%M:%S)"
