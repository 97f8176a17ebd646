"""A uniform weight average ("model soup", Wortsman et al. 2022) of checkpoints fine-tuned from one pretrained model
(session 46, issue 20): every tensor of model.safetensors is the mean of the ingredients' tensors, in fp32. The
other files (config, tokenizer, chat template) come from the first ingredient, which must share them with the rest;
atom_state.json records the ingredients. Why: the `real` preset's tunes from one SFT land within -0.05 to +0.03 of
each other on transfer with different answers changed; averaging fine-tunes that share an init often keeps what
each learned and drops what each overfit, at no training cost.

    python bench/learning_runs/s46/soup.py --out DIR CKPT CKPT [CKPT ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

WEIGHTS = "model.safetensors"
SHARED = ("config.json", "tokenizer.json")  # must be byte-identical across ingredients


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpts", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if len(a.ckpts) < 2:
        ap.error("a soup needs at least two checkpoints")
    srcs, out = [Path(c) for c in a.ckpts], Path(a.out)
    for s in srcs:
        if not (s / WEIGHTS).is_file():
            sys.exit(f"{s}: no {WEIGHTS} (a full checkpoint folder is needed, not a LoRA adapter)")
        for name in SHARED:
            if (s / name).read_bytes() != (srcs[0] / name).read_bytes():
                sys.exit(f"{s}/{name} differs from {srcs[0]}/{name}: not ingredients of one soup")
    if out.exists():
        sys.exit(f"{out} exists")

    import torch
    from safetensors.torch import load_file, save_file

    total = {k: v.to(torch.float64) for k, v in load_file(str(srcs[0] / WEIGHTS)).items()}
    for s in srcs[1:]:
        w = load_file(str(s / WEIGHTS))
        if w.keys() != total.keys():
            sys.exit(f"{s}/{WEIGHTS}: other tensor names than {srcs[0]}")
        for k, v in w.items():
            total[k] += v.to(torch.float64)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: (v / len(srcs)).to(torch.float32).contiguous() for k, v in total.items()}, str(tmp / WEIGHTS),
              metadata={"format": "pt"})
    for f in srcs[0].iterdir():
        if f.is_file() and f.name not in (WEIGHTS, "atom_state.json", "metrics.json", "optimizer.pt"):
            shutil.copy2(f, tmp / f.name)
    state = json.loads((srcs[0] / "atom_state.json").read_text()) if (srcs[0] / "atom_state.json").is_file() else {}
    state.update({"stage": "soup", "optimizer": False, "soup": [str(s.resolve()) for s in srcs]})
    (tmp / "atom_state.json").write_text(json.dumps(state, indent=1))
    tmp.rename(out)
    print(f"soup of {len(srcs)} -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
