"""A uniform weight average ("model soup", Wortsman et al. 2022) of checkpoints fine-tuned from one pretrained model
(session 46, issue 20), by atomcli.train.soup.average, the function run-all's `rft_soup` uses: every tensor of
model.safetensors is the mean of the ingredients' tensors (summed in float64, written in float32); config and
tokenizer come from the first ingredient and must match the rest. Session 46's first two soups (s0r12, s01r2) ran
this script's first version, which did the same arithmetic in the script itself.

    python bench/learning_runs/s46/soup.py --out DIR CKPT CKPT [CKPT ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpts", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if Path(a.out).exists():
        sys.exit(f"{a.out} exists")
    from atomcli.errors import InputError
    from atomcli.train import soup
    try:
        soup.average(a.ckpts, a.out)
    except InputError as e:
        sys.exit(f"soup: {e}")
    print(f"soup of {len(a.ckpts)} -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
