"""Checkpoint folders written by `sft` and `grpo-step`, and what later steps read back.

A checkpoint is a plain transformers folder (`save_pretrained` model + tokenizer) that any
stage or tool loads as is, plus:

- `atom_state.json`: the stage that wrote it, the GRPO step counter, the run's reference
  checkpoint (later `grpo-step` calls default `--ref` to it, so the KL term always pulls
  towards where the run started), the LoRA base when an adapter is trained, the config,
  and the chain of stages that led here;
- `optimizer.pt`: the AdamW state dict, so consecutive `grpo-step` calls continue one
  optimizer trajectory (moments and bias-correction step included);
- `metrics.json`: what the stage measured (loss, KL, clip fraction, time...);
- `adapter/` (LoRA runs only): the peft adapter. The top-level weights are then the
  adapter merged into its base (computed out of place), so rollout and eval need no peft,
  while the next `grpo-step --lora` reloads base + adapter and keeps training the adapter.
  Its `adapter_config.json` names the base as an absolute folder (or the hub id), so
  `AutoPeftModelForCausalLM.from_pretrained(".../adapter")` works from any working directory.

The tokenizer is saved so that transformers 4.x loads it too: transformers 5 records its fast
tokenizers as `TokenizersBackend`, a class 4.x does not have; `PreTrainedTokenizerFast` is the
same class in 5.x (an alias) and the generic fast tokenizer in 4.x (portable_tokenizer_config).

Everything is written into a temporary folder and renamed into place (tableio.atomic_dir), every
file with the umask's mode, the weights too (transformers writes them 0600): a policy server running
as another user reads them.
Under torch.distributed only rank 0 writes; what was sharded over ranks (FSDP weights, AdamW
moments) arrives already gathered (atomcli.train.accel), so the files are the same for any
launch and any world size resumes them.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomcli import __version__
from atomcli.errors import InputError

STATE_FILE = "atom_state.json"
METRICS_FILE = "metrics.json"
OPTIMIZER_FILE = "optimizer.pt"
ADAPTER_DIR = "adapter"
PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # 4.x's generic fast tokenizer; 5.x's TokenizersBackend


@dataclass
class TrainResult:
    """What a training stage hands to `save`."""
    model: Any                       # transformers model, or a peft model when `lora`
    tokenizer: Any
    step: int                        # GRPO updates of this run so far (0 after sft)
    metrics: dict
    base: str                        # the checkpoint training started from (spec or path)
    lora: bool = False               # `model` is a peft model whose adapter is saved separately
    lora_base: str | None = None     # the checkpoint the adapter applies to
    optimizer_state: dict | None = None
    ref: str | None = None           # the run's reference checkpoint for the KL term
    extra: dict = field(default_factory=dict)  # more fields for atom_state.json
    state_dict: dict | None = None   # full weights gathered from sharded ranks (FSDP); None: read `model`


def spec_id(spec: str) -> str:
    """A model spec as it should be remembered: the demo name, or an absolute folder path."""
    from atomcli.models import DEMO_MODEL
    p = Path(spec).expanduser()
    return spec if spec == DEMO_MODEL or not p.is_dir() else str(p.resolve())


def read_state(spec: str) -> dict:
    """The atom_state.json of a checkpoint folder ({} for other models)."""
    p = Path(spec).expanduser() / STATE_FILE
    if not p.is_file():
        return {}
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except ValueError as e:
        raise InputError(f"unreadable {STATE_FILE} ({e})", file=str(p),
                         hint="the checkpoint is damaged; rewrite it or delete the file") from None


def read_optimizer_state(spec: str) -> dict | None:
    import torch
    p = Path(spec).expanduser() / OPTIMIZER_FILE
    return torch.load(p, map_location="cpu", weights_only=True) if p.is_file() else None


def adapter_dir(spec: str) -> Path:
    return Path(spec).expanduser() / ADAPTER_DIR


def is_main_process() -> bool:
    """Rank 0 of a launch, or a lone process. The launcher's RANK counts too: after TRL's SFTTrainer
    the process group is no longer initialized when the checkpoint is written."""
    import os

    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def make_state(result: TrainResult, *, stage: str, config: Any = None, parent: dict | None = None) -> dict:
    """The atom_state.json of `result`'s checkpoint. `parent`: the state of the checkpoint it was
    trained from (default: read from `result.base`; run-all passes the in-memory one, which may not
    have been saved)."""
    from atomcli import schema
    if parent is None:
        parent = read_state(result.base)
    return {
        "format": 1,
        "stage": stage,
        "version": __version__,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "step": result.step,
        "base": result.base,
        "ref": result.ref,
        "lora": result.lora,
        "lora_base": result.lora_base,
        "optimizer": result.optimizer_state is not None,
        "config": schema._jsonable(config),
        **result.extra,
        # the chain of stages that produced this checkpoint, oldest first
        "history": parent.get("history", []) + [{"stage": stage, "step": result.step, "from": result.base}],
    }


def save(result: TrainResult, out: str, *, stage: str, config: Any = None, context=None,
         state: dict | None = None) -> None:
    """Write the checkpoint folder `out` atomically (rank 0 only). `state`: its atom_state.json
    (default: make_state with the parent read from disk)."""
    import torch

    from atomcli import schema
    from atomcli.tableio import atomic_dir

    if not is_main_process():
        return
    if state is None:
        state = make_state(result, stage=stage, config=config)
    with atomic_dir(out) as tmp:
        if result.lora:
            result.model.save_pretrained(tmp / ADAPTER_DIR)
            _absolute_adapter_base(tmp / ADAPTER_DIR, result.lora_base or result.base, context)
            lm = result.model.get_base_model()
            lm.save_pretrained(tmp, state_dict=merged_state_dict(result.model))
        elif result.state_dict is not None:
            unsharded_copy(result.model, result.state_dict).save_pretrained(tmp)
        else:
            result.model.save_pretrained(tmp)
        result.tokenizer.save_pretrained(tmp)
        portable_tokenizer_config(tmp)
        if result.optimizer_state is not None:
            torch.save(result.optimizer_state, tmp / OPTIMIZER_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        (tmp / METRICS_FILE).write_text(json.dumps(schema._jsonable(result.metrics), indent=1) + "\n",
                                        encoding="utf-8")


def unsharded_copy(model, state_dict: dict):
    """A plain model holding `state_dict` (gathered from FSDP ranks), built without allocating weights.

    save_pretrained on the sharded live model would read its DTensors, which gathers, on rank 0 alone."""
    import torch
    cls = type(model)
    if cls.__name__.startswith("FSDP"):  # FSDP2 swaps in a subclass; the model's own class follows it
        cls = next(c for c in cls.__mro__[1:] if not c.__name__.startswith("FSDP"))
    with torch.device("meta"):
        copy = cls(model.config)
    copy.load_state_dict(state_dict, strict=False, assign=True)
    if getattr(model, "generation_config", None) is not None:
        copy.generation_config = model.generation_config
    if hasattr(copy, "tie_weights"):
        copy.tie_weights()
    return copy


def _absolute_adapter_base(adapter: Path, base: str, context) -> None:
    """peft records the base as the path it was loaded from, often relative: make it loadable from anywhere."""
    from atomcli import models
    if base == models.DEMO_MODEL:
        where = str(models.demo_model_dir(context.home if context is not None else None).resolve())
    else:
        p = Path(base).expanduser()
        where = str(p.resolve()) if p.is_dir() else base  # a hub id stays a hub id
    path = adapter / "adapter_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = where
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def portable_tokenizer_config(folder: Path) -> None:
    """Rewrite a saved tokenizer_config.json so that transformers 4.x and 5.x load the same tokenizer.

    5.x writes `tokenizer_class: TokenizersBackend` (4.x: "Tokenizer class TokenizersBackend does not exist"),
    may list extra special tokens under `extra_special_tokens` as a list (4.x expects a dict there), and keeps
    the chat template only in chat_template.jinja (4.x before ~4.50 reads it from tokenizer_config.json); the
    4.x names (`PreTrainedTokenizerFast`, `additional_special_tokens`, `chat_template`) mean the same to 5.x."""
    path = Path(folder) / "tokenizer_config.json"
    if not path.is_file():
        return
    cfg = json.loads(path.read_text(encoding="utf-8"))
    changed = False
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
        changed = True
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):
        del cfg["extra_special_tokens"]
        if extra and "additional_special_tokens" not in cfg:
            cfg["additional_special_tokens"] = extra
        changed = True
    jinja = Path(folder) / "chat_template.jinja"
    if jinja.is_file() and "chat_template" not in cfg:
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")  # the .jinja file stays, for 5.x and late 4.x
        changed = True
    if changed:
        path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def merged_state_dict(peft_model) -> dict:
    """The base model's state dict with every LoRA delta added, computed without touching the model."""
    import torch
    lm = peft_model.get_base_model()
    sd = {}
    for name, tensor in lm.state_dict().items():
        if ".lora_" in name:
            continue
        sd[name.replace(".base_layer.", ".")] = tensor
    with torch.no_grad():
        for name, mod in lm.named_modules():
            if hasattr(mod, "get_delta_weight") and hasattr(mod, "base_layer"):
                delta = sum(mod.get_delta_weight(a) for a in mod.active_adapters if a in mod.lora_A)
                sd[f"{name}.weight"] = mod.base_layer.weight + delta
    return sd
