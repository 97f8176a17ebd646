"""The tensors of one micro-batch of the GRPO update: what `grpo.micro_batches` builds, the loss reads
and `accel.dummy_micro_batch` pads with. Its own module so that `grpo` and `accel` share it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MicroBatch:
    input_ids: object       # [b, L] right-padded
    attention_mask: object  # [b, L]
    rows: object            # [n] which sequence each target token belongs to
    cols: object            # [n] position of the hidden state that predicts it
    targets: object         # [n] completion tokens up to each row's last sampled one
    loss_mask: object       # [n] 1 = sampled by the policy, 0 = tool response / template glue
    old: object             # [n]
    adv: object             # [n] each token's advantage: its turn's (turn_advantages), else the trajectory's
    weight: object          # [n] the token's share of the aggregated loss
    n_input_tokens: int
    ref: object = None      # [n] reference log-probs, filled when beta > 0
