"""The names of the files and folders inside a run-all run folder, defined once.

The loop and the rounds write them; resume, the report and the tests read them.
"""

from __future__ import annotations

MARKER = "atom_run.json"        # the folder was made by run-all (atomcli.safety.RUN_MARKER has the same name)
CONFIG = "config.json"          # the settings the run started with (--resume compares against them)
LOCK = ".atom_run.lock"         # held (fcntl.flock) by the process writing the folder; holds its pid
WORLD, REAL, TINY_MODEL = "world", "real", "tiny-model"  # what a preset builds before the run
SFT = "sft"                     # the SFT checkpoint
STEPS = "steps"                 # steps/NNNN/: one GRPO step's tables and checkpoint
RFT_ROOT = "rft"                # rft/NN/: one rejection-sampling round
SOUP, SOUP_POINT = "soup", "rft-soup"  # rft/soup/ckpt, evaluated as eval/rft-soup.json
EVAL = "eval"                   # eval/<point>.{parquet,json}
TRANSFER, DEV = "transfer", "dev"  # eval/ subfolders: the second test set, the held-out training questions
FINAL_FILE = "final.json"       # which checkpoint a run with a dev split chose as final, and why
METRICS = "metrics.jsonl"       # one line per GRPO step (step_metrics)
SUMMARY = "summary.md"
PLOTS = "plots"
