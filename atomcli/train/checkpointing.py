"""Activation checkpointing (recompute activations in the backward pass) across transformers 5.x's rename.

transformers 5.25 renamed `gradient_checkpointing*` to `activation_checkpointing*`, on models and in
`TrainingArguments`, and warns at every use of the old names; earlier 5.x releases have only the old ones. The
training stages ask here, so the choice between the two names is made in one place.
"""

from __future__ import annotations

import dataclasses


def enable(model) -> None:
    """Turn checkpointing on, non-reentrant (the newer name's default; the old one needs it asked for)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def disable(model) -> None:
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()


def trainer_arg(args_class) -> str:
    """The name of the on/off field of a TrainingArguments dataclass (TRL's SFTConfig is one)."""
    names = {f.name for f in dataclasses.fields(args_class)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
