"""Stage `sft`: supervised fine-tuning on atomic-thought trajectories through TRL.

Trains on assistant tokens only (the trajectory table's loss mask, or the chat rendering
of `messages` with tool and user turns masked).
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class SFTConfig:
    model: str = opt("smollm2", "base model: `smollm2`, a checkpoint folder or hub id")
    epochs: float = opt(1.0, "passes over the data")
    lr: float = opt(5e-5, "learning rate")
    batch_size: int = opt(4, "sequences per device batch")
    grad_accum: int = opt(1, "gradient accumulation steps")
    max_length: int = opt(2048, "truncate sequences to this many tokens")
    min_reward: float = opt(float("-inf"), "keep only rows with reward >= this (rejection sampling)")
    lora: bool = opt(False, "train a LoRA adapter (peft) and merge it into the saved checkpoint")
    lora_r: int = opt(16, "LoRA rank")
    seed: int = opt(0, "random seed")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run")


def run(table, config: SFTConfig, context):
    raise NotBuiltError("`atom sft` is not built yet")
