"""A uniform weight average of full checkpoints fine-tuned from one model ("model soup", Wortsman et al. 2022).

run-all averages its rejection-sampling rounds' checkpoints with it (`[run-all] rft_soup`). Every round tunes
the same SFT checkpoint on a different set of the policy's own right answers, so the rounds are siblings from
one init, which is when averaging weights works: each tune's changes that carry to new questions add up, and
each one's overfit to its own rows is averaged down. On the `real` preset the average of its two rounds
transferred better than either round (docs/experiments.md has the numbers).

Every tensor of model.safetensors is the mean of the ingredients' tensors, summed in float64 and written in
the first ingredient's dtype. The other files come from the first ingredient: the
config and tokenizer must be byte-identical across ingredients, and atom_state.json records them.
A damaged ingredient (a truncated model.safetensors) is an InputError naming its file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from atomcli.errors import InputError

WEIGHTS = "model.safetensors"
SHARED = ("config.json", "tokenizer.json")  # must be the same in every ingredient
NOT_COPIED = (WEIGHTS, "atom_state.json", "metrics.json", "optimizer.pt")


def check(ckpts: list[str]) -> None:
    """Refuse ingredients that cannot be averaged: fewer than two, no full weights, or another config/tokenizer."""
    if len(ckpts) < 2:
        raise InputError(f"a soup needs at least two checkpoints, got {len(ckpts)}", hint="name two or more")
    first = Path(ckpts[0])
    def shared(c: Path) -> dict:  # None for a file the folder lacks
        return {name: (c / name).read_bytes() if (c / name).is_file() else None for name in SHARED}
    for c in map(Path, ckpts):
        if not (c / WEIGHTS).is_file():
            raise InputError(f"no {WEIGHTS}: a soup averages full checkpoints", file=str(c),
                             hint="a LoRA adapter folder holds no full weights; save the merged model")
    want = shared(first)
    for c in map(Path, ckpts[1:]):
        for name, data in shared(c).items():
            if data != want[name]:
                raise InputError(f"{name} differs from {first / name}", file=str(c / name),
                                 hint="average only checkpoints fine-tuned from one model")


def _load(path: Path) -> dict:
    """The tensors of one ingredient's weights; a damaged file is an InputError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(f"not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                         file=str(path), hint="the checkpoint may be truncated or damaged; rewrite it, or leave "
                                              "it out of the soup") from None


def average(ckpts: list[str], out: str) -> None:
    """Write the uniform average of checkpoint folders `ckpts` to folder `out` (atomically: a temporary
    folder renamed into place, files with the umask's mode, like every checkpoint)."""
    import torch
    from safetensors.torch import save_file

    from atomcli.tableio import atomic_dir

    check(ckpts)
    srcs = [Path(c) for c in ckpts]
    first = _load(srcs[0] / WEIGHTS)
    dtypes = {k: v.dtype for k, v in first.items()}
    total = {k: v.to(torch.float64) for k, v in first.items()}
    for s in srcs[1:]:
        weights = _load(s / WEIGHTS)
        if weights.keys() != total.keys() or any(weights[k].shape != total[k].shape for k in total):
            raise InputError(f"{WEIGHTS} has other tensors than {srcs[0] / WEIGHTS}", file=str(s / WEIGHTS),
                             hint="average only checkpoints of one architecture")
        for k, v in weights.items():
            total[k] += v.to(torch.float64)
    first_state = srcs[0] / "atom_state.json"
    state = json.loads(first_state.read_text(encoding="utf-8")) if first_state.is_file() else {}
    state.update({"stage": "soup", "optimizer": False, "soup": [str(s.resolve()) for s in srcs],
                  "history": state.get("history", []) + [{"stage": "soup", "from": [str(s) for s in srcs]}]})
    with atomic_dir(out) as tmp:
        save_file({k: (v / len(srcs)).to(dtypes[k]).contiguous() for k, v in total.items()}, str(tmp / WEIGHTS),
                  metadata={"format": "pt"})
        for f in srcs[0].iterdir():
            if f.is_file() and f.name not in NOT_COPIED:
                shutil.copy2(f, tmp / f.name)
        (tmp / "atom_state.json").write_text(json.dumps(state, indent=1), encoding="utf-8")
