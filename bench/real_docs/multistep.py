"""A trial SFT set (session 37): the stepwise-real world's rows plus a second copy of every real row that needs more
than one search or a browse, written by the real expert with another seed (the same tool calls, other wording).

Why: the policy trained on the stepwise-real rows makes one search in 114 of its 115 test answers and never
browses, although 31 of its answers were lost for want of a second search or a browse (session 36). Of the 403 real
rows, 309 are one search and an answer; the rows that show when one search is not enough are about a quarter of
the real rows and get outvoted. This doubles them without new questions or any test-split text.

    python bench/real_docs/multistep.py runs/s35/wq runs/s37/wm   # reads WORLD/sft.parquet and WORLD/index.sqlite

The output folder gets `sft.parquet` only (train and evaluate with the world's own test split and index).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def multistep(row: dict) -> bool:
    """A row that searched more than once or browsed."""
    return row["n_search"] > 1 or row["n_browse"] > 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("world", type=Path, help="a stepwise-real demo world (sft.parquet, index.sqlite)")
    ap.add_argument("out", type=Path, help="folder for the new sft.parquet")
    ap.add_argument("--seed", type=int, default=1, help="the real expert's wording seed for the copies")
    args = ap.parse_args()
    import json

    import pyarrow.parquet as pq

    from atomcli import schema, tableio
    from atomcli.context import Context
    from atomcli.demo import real_sft, world
    from atomcli.env import search_local

    table = pq.read_table(args.world / "sft.parquet")
    config = json.loads(table.schema.metadata[schema.META_KEY])["provenance"][0]["config"]
    rows = table.to_pylist()
    real_ids = {r["id"] for r in rows if r["data_source"].startswith(config["real"])}
    copies, _ = real_sft.trajectories(config["real"], seed=args.seed, context=Context(quiet=True),
                                      spec="local:" + str(args.world / "index.sqlite"), snippets=config["snippets"])
    extra = [dict(r, traj_id=r["id"] + "/1", sample_idx=1) for r in copies if r["id"] in real_ids and multistep(r)]
    mix = rows + extra
    random.Random(f"multistep:{args.seed}").shuffle(mix)
    config = dict(config, multistep_copies=len(extra), multistep_seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sft.parquet").write_bytes(tableio.table_bytes(world.sft_table(mix, config), "parquet"))
    before = sum(multistep(r) for r in rows if r["id"] in real_ids)
    print(f"{len(rows)} rows ({len(real_ids)} real, {before} of them multi-step) + {len(extra)} multi-step copies "
          f"-> {len(mix)} rows in {args.out / 'sft.parquet'}", file=sys.stderr)


if __name__ == "__main__":
    main()
