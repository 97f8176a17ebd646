#!/bin/bash
# Side by side with the run's round-1 rollout: the same stage on the same first 100 questions, from the same SFT
# checkpoint with the same settings and seed, in a fresh process (session 41 saw run-all's rollouts run slower
# after its SFT than a fresh process's). Compare the time to 100 groups with the run's progress lines.
cd /work/main
export HF_HUB_OFFLINE=1
R=runs/s42/real
printf '[rollout]\ngroup_size = 1\nmax_turns = 4\nmax_new_tokens = 192\nk = 3\ntemperature = 0.7\nbatch_size = 50\ndate = "2026-01-01"\nprecision = "bf16"\nsearch_options = "snippets=query"\n' > runs/s42/fresh.toml
/usr/bin/time -v .venv/bin/atom rollout $R/rft/01/questions.parquet --model $R/sft --search local:$R/world/index.sqlite \
  --config runs/s42/fresh.toml --seed 0 --limit 100 --out runs/s42/fresh_rollout.parquet 2> runs/s42/fresh_rollout.log
