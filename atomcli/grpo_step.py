"""Stage `grpo-step`: one GRPO policy update from a rewarded table (DESIGN.md §6).

Tokens with `loss_mask = 0` (tool responses, template glue) never enter the loss. The
optimizer state is saved with the checkpoint so consecutive calls continue one AdamW run.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class GRPOConfig:
    model: str = opt("smollm2", "policy checkpoint to update")
    ref: str = opt("", "reference checkpoint for the KL term (default: the run's starting checkpoint)")
    lr: float = opt(1e-6, "learning rate (AdamW, constant)")
    beta: float = opt(0.001, "KL coefficient (k3 estimator); 0 disables the reference model")
    clip_eps: float = opt(0.2, "lower clip epsilon")
    clip_eps_high: float = opt(0.2, "upper clip epsilon (DAPO clip-higher when > clip-eps)")
    entropy_coef: float = opt(0.0, "entropy bonus coefficient")
    loss_agg: str = opt("token-mean", "loss aggregation: token-mean or seq-mean")
    micro_batch: int = opt(4, "trajectories per forward/backward (gradient accumulation)")
    epochs: int = opt(1, "updates per batch")
    max_grad_norm: float = opt(1.0, "gradient norm clip")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    lora: bool = opt(False, "train a LoRA adapter (peft) instead of all weights")
    lora_r: int = opt(16, "LoRA rank")
    seed: int = opt(0, "random seed")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run")


def run(table, config: GRPOConfig, context):
    raise NotBuiltError("`atom grpo-step` is not built yet")
