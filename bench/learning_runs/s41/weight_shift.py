"""Session 41's diagnosis numbers (LEARNING.md, session 41), recomputed from the checkpoints and tables on the
machine: how far each training phase moved the weights (relative L2 norm of the difference over all tensors), and
the training samples' F1 by hop count at each of session 40's GRPO steps. Output: weight_shift.txt."""
import collections
import os

import pyarrow.parquet as pq
from safetensors.torch import load_file


def shift(a_path, b_path):
    a, b = load_file(a_path), load_file(b_path)
    num = sum(((b[k].float() - a[k].float()) ** 2).sum() for k in a)
    den = sum((a[k].float() ** 2).sum() for k in a)
    return (num / den).sqrt().item()


W = "model.safetensors"
for name, a, b in [("sft vs base", os.path.expanduser("~/.cache/atomcli/models/smollm2/" + W), "runs/s40/learn/sft/" + W),
                   ("grpo step 4 vs sft", "runs/s40/learn/sft/" + W, "runs/s40/learn/steps/0004/ckpt/" + W),
                   ("rft-01 vs sft", "runs/s40/learn/sft/" + W, "runs/s41/learn/rft/01/ckpt/" + W)]:
    print(f"{name}: {100 * shift(a, b):.3f}% of the weight norm")
for s in range(1, 9):
    rows = pq.read_table(f"runs/s40/learn/steps/{s:04d}/rewarded.parquet", columns=["data_source", "f1"]).to_pylist()
    by = collections.defaultdict(list)
    for r in rows:
        by[r["data_source"]].append(r["f1"] or 0.0)
    print(f"step {s}: " + ", ".join(f"{k} sampled F1 {sum(v) / len(v):.2f} (n={len(v)})" for k, v in sorted(by.items())))
