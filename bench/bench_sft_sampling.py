"""SFT batch padding and step time: `--sampling random` against `--sampling length`, side by side.

    python bench/bench_sft_sampling.py SFT.parquet [--batch-size 4] [--seeds 5] [--max-length 2048] [--time-rows 0]

Padding (no model run): the share of each padded batch that is padding, over one epoch, for both samplers,
with the very index functions transformers' samplers use (a random permutation; `get_length_grouped_indices`),
averaged over `--seeds` shuffles. Padded tokens are what a CPU step pays for: attention and the MLP run on them.

`--time-rows N` also times one SFT epoch over the same N random rows with each
sampler (SmolLM2, bf16 as the learn preset trains, the one that ran first alternating per repeat) and prints the
ratio of the wall times. Both runs see the same rows once each, so the ratio is the cost of the padding alone.
Run it alone: it is a model job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def batches(order: list[int], batch_size: int) -> list[list[int]]:
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def padding(lengths: list[int], order: list[int], batch_size: int) -> tuple[float, int]:
    """(padded share, tokens run) of one epoch in `order`."""
    run = sum(len(b) * max(lengths[i] for i in b) for b in batches(order, batch_size))
    return 1 - sum(lengths) / run, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-length", type=int, default=2048, help="rows are cut to this many tokens, as in training")
    ap.add_argument("--time-rows", type=int, default=0)
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args()

    import pyarrow as pa
    import torch
    from transformers.trainer_pt_utils import get_length_grouped_indices

    from atomcli import models, tableio
    from atomcli.context import Context
    from atomcli.stages import sft

    table = tableio.read_table(args.table)
    _, tok = models.load(args.model, Context(quiet=True))
    examples, _ = sft.build_examples(table, tok)
    lengths = [min(len(x), args.max_length) for x in examples["input_ids"]]
    print(f"{len(lengths)} rows, tokens mean {statistics.mean(lengths):.0f}, max {max(lengths)}, "
          f"batch size {args.batch_size}")
    res = {"random": [], "length": []}
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(seed)
        res["random"].append(padding(lengths, torch.randperm(len(lengths), generator=g).tolist(), args.batch_size))
        g = torch.Generator().manual_seed(seed)
        order = get_length_grouped_indices(lengths, args.batch_size, generator=g)
        res["length"].append(padding(lengths, order, args.batch_size))
    for name, r in res.items():
        print(f"{name:>7}: padding {statistics.mean(p for p, _ in r):.1%}, tokens run per epoch "
              f"{statistics.mean(t for _, t in r):,.0f}")
    ratio = statistics.mean(t for _, t in res["length"]) / statistics.mean(t for _, t in res["random"])
    print(f"tokens run, length / random: {ratio:.3f}")

    if args.time_rows:
        rows = torch.randperm(table.num_rows, generator=torch.Generator().manual_seed(0))[:args.time_rows].tolist()
        sub = table.take(pa.array(sorted(rows)))
        wall = {"random": [], "length": []}
        for rep, first in enumerate(("random", "length")):
            for name in (first, "length" if first == "random" else "random"):
                cfg = sft.SFTConfig(model=args.model, batch_size=args.batch_size, epochs=1, lr=1e-4,
                                    max_length=args.max_length,
                                    precision="bf16", gradient_checkpointing=False, sampling=name, seed=rep)
                t0 = time.perf_counter()
                out = sft.run(sub, cfg, Context(quiet=True))
                wall[name].append(time.perf_counter() - t0)
                print(f"  repeat {rep} {name:>7}: {out.metrics['steps']} steps, {wall[name][-1]:.1f} s",
                      file=sys.stderr)
        m = {k: statistics.median(v) for k, v in wall.items()}
        print(f"epoch over {args.time_rows} rows: random {m['random']:.1f} s, length {m['length']:.1f} s, "
              f"length / random {m['length'] / m['random']:.3f}")


if __name__ == "__main__":
    main()
