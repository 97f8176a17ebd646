"""The GRPO update, as plain math over token tensors (docs/design.md, "The GRPO update").

Per target token t of trajectory i (its completion tokens up to the last one it sampled):

    r    = exp(logp - old)                                  the policy ratio
    loss = [-min(r·A, clip(r, 1-eps, 1+eps_high)·A) + beta·k3 - entropy_coef·H] · loss_mask
    k3   = exp(ref - logp) - (ref - logp) - 1

A is the trajectory's advantage, or with turn-level credit the advantage of the assistant
turn the token belongs to (`Trajectory.token_adv`; the same formula either way).
`loss_mask` is 1 for tokens the policy sampled and 0 for tool responses and template glue:
the one line in `grpo_token_loss` that multiplies by it is where those tokens leave the loss.
Aggregated as a token-mean over the whole batch (weight 1 / sampled tokens) or a mean over
trajectories of per-trajectory token means. Micro-batches accumulate gradients weighted by
the *global* count, so the gradient equals the full-batch gradient whatever the micro-batch
size or the number of processes: every rank trains on every world-th trajectory, its losses
are scaled by the world size (DDP, FSDP and DeepSpeed average gradients over ranks, the sum
is wanted) and accelerate synchronizes once, after the last micro-batch (`accelerator.accumulate`
holds the others back with no_sync). atomcli.train.accel has the accelerate side.

Everything takes plain arguments (`LossSettings`, tensors, a model): the `grpo-step` stage
reads and validates the table, and builds these from its config.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from atomcli.train.microbatch import MicroBatch

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps a stale or corrupt old_logprob from producing inf


@dataclass
class LossSettings:
    """What the loss and the update need to know (grpo-step fills it from its config)."""
    clip_eps: float = 0.2
    clip_eps_high: float = 0.2
    beta: float = 0.0
    entropy_coef: float = 0.0
    loss_agg: str = "token-mean"   # or seq-mean
    temperature: float = 1.0
    micro_batch: int = 4
    max_grad_norm: float = 1.0


@dataclass
class Trajectory:
    """One row, trimmed to what the loss needs: tokens after the last sampled one are never read.

    Every completion token up to the last sampled one is a target, each with its loss_mask
    (1 = sampled by the policy, 0 = inserted by the environment); the loss applies the mask."""
    row: int
    input_ids: list[int]   # prompt + completion up to (not including) the last target
    start: int             # index in input_ids of the hidden state predicting the first target
    targets: list[int]     # completion tokens up to the last sampled one
    loss_mask: list[int]   # their loss_mask (1 = sampled, 0 = tool response / template glue)
    old: list[float]       # sampling log-probs (0.0 where the mask is 0: never read)
    advantage: float
    token_adv: list[float] | None = None  # per target: its turn's advantage (--credit turn); None = `advantage`


@dataclass
class Batch:
    trajectories: list[Trajectory]  # rows with at least one sampled token (minus skipped ones)
    n_rows: int
    n_tokens: int                   # sampled tokens in the whole batch (the token-mean denominator)
    max_id: int
    stats: dict = field(default_factory=dict)
    n_seqs: int = 0                 # rows with at least one sampled token (the seq-mean denominator)
    skipped: int = 0                # zero-advantage rows left out of the passes (they add no gradient)
    skipped_tokens: int = 0


# --- distributed ----------------------------------------------------------------------------------

@dataclass
class World:
    """Which share of the batch this process trains: every `size`-th trajectory from `rank`."""
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


# --- micro-batches --------------------------------------------------------------------------------

def micro_batches(batch: Batch, config: LossSettings, world: World, device, pad_id: int = 0) -> list[MicroBatch]:
    """This rank's share of the batch, in micro-batches of similar lengths, with loss weights."""
    import torch
    n_seqs = batch.n_seqs or len(batch.trajectories)
    # longest first, dealt round-robin: ranks get similar token counts, micro-batches little padding
    order = sorted(batch.trajectories, key=lambda t: (-len(t.input_ids), t.row))[world.rank::world.size]
    out = []
    for s in range(0, len(order), config.micro_batch):
        chunk = order[s:s + config.micro_batch]
        length = max(len(t.input_ids) for t in chunk)
        ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), length), dtype=torch.long)
        rows, cols, targets, mask, old, adv, weight = [], [], [], [], [], [], []
        for b, t in enumerate(chunk):
            ids[b, :len(t.input_ids)] = torch.tensor(t.input_ids, dtype=torch.long)
            att[b, :len(t.input_ids)] = 1
            n = len(t.targets)
            rows += [b] * n
            cols += range(t.start, t.start + n)
            targets += t.targets
            mask += t.loss_mask
            old += t.old
            adv += t.token_adv if t.token_adv is not None else [t.advantage] * n
            sampled = sum(t.loss_mask)
            w = 1.0 / batch.n_tokens if config.loss_agg == "token-mean" else 1.0 / (sampled * n_seqs)
            weight += [w] * n
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        as_float = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
        out.append(MicroBatch(ids.to(device), att.to(device), as_long(rows), as_long(cols), as_long(targets),
                              as_float(mask), as_float(old), as_float(adv), as_float(weight), int(att.sum())))
    return out


# --- the update -----------------------------------------------------------------------------------

STAT_NAMES = ("loss", "pg_loss", "kl", "entropy", "clip_low", "clip_high", "ratio", "tokens")


def grpo_update(model, optimizer, mbs: list[MicroBatch], config: LossSettings, accelerator=None,
                zero_fill: bool = False, on_micro_batch: Callable[[], None] | None = None) -> dict:
    """One optimizer step over the whole (global) batch. Returns the batch-level metrics.

    model: the policy scorer (atomcli.train.accel.policy_scorer), prepared by `accelerator` when
    one is given; without one (tests) a plain module and plain torch.
    mbs: this rank's micro-batches, as many on every rank (accel.pad_micro_batches).
    zero_fill: rows were skipped (read_batch skip_zero), so a parameter that got no gradient
    gets an explicit 0, as the full pass would have given it: AdamW then advances its moments
    exactly as in the full update (a None gradient would leave them untouched).
    on_micro_batch: called after each micro-batch's forward/backward (progress)."""
    import torch

    from atomcli.train import accel
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    t0 = time.perf_counter()
    if accelerator is not None:
        # one synchronization per update: accumulate() holds back every pass but the last
        accelerator.gradient_accumulation_steps = max(len(mbs), 1)
        accelerator.step = 0
    scale = accel.loss_scale(accelerator)
    try:
        for mb in mbs:
            with accelerator.accumulate(model) if accelerator is not None else contextlib.nullcontext():
                logp, ent = model(mb.input_ids, mb.attention_mask, mb.rows, mb.cols, mb.targets,
                                  temperature=config.temperature)
                loss, parts = grpo_token_loss(logp, ent, mb, config)
                if accelerator is not None:
                    accelerator.backward(loss * scale)
                else:
                    loss.backward()
            stats += torch.stack(parts).cpu()
            if on_micro_batch is not None:
                on_micro_batch()
    finally:
        if accelerator is not None:
            accelerator.gradient_accumulation_steps = 1
    stats = accel.all_sum(accelerator, stats)
    if zero_fill:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
    if accelerator is not None:
        norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if norm is None:  # DeepSpeed clipped and stepped inside its engine and reports no norm
        grad_norm, skipped = math.nan, False
    else:
        from torch.distributed.tensor import DTensor
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        skipped = not math.isfinite(grad_norm)
    if skipped:  # a NaN/inf gradient would destroy the weights: keep them, say so
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    m = dict(zip(STAT_NAMES, stats.tolist()))
    tokens = accel.all_sum(accelerator, torch.tensor([sum(mb.n_input_tokens for mb in mbs)],
                                                     dtype=torch.float64)).item()
    # plain fractions / means over the sampled tokens forwarded; none forwarded (every row skipped) is no
    # measurement, so null rather than 0; KL is only computed against a reference (beta > 0)
    for k in ("kl", "entropy", "clip_low", "clip_high", "ratio"):
        m[k] = m[k] / m["tokens"] if m["tokens"] > 0 else None
    if config.beta <= 0:
        m["kl"] = None
    m.update(grad_norm=grad_norm, skipped=skipped, seconds=seconds, input_tokens=int(tokens),
             trained_tokens=int(m.pop("tokens")), tokens_per_s=tokens / seconds if seconds > 0 else None)
    return m


def grpo_token_loss(logp, ent, mb: MicroBatch, config: LossSettings):
    """The micro-batch's share of the loss, and its share of each metric (as weighted sums)."""
    import torch
    log_ratio = (logp - mb.old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps_high)
    pg = -torch.min(ratio * mb.adv, clipped * mb.adv)
    per_token = pg
    kl_tok = torch.zeros_like(logp)
    if config.beta > 0:
        d = (mb.ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_tok = d.exp() - d - 1
        per_token = per_token + config.beta * kl_tok
    if config.entropy_coef > 0:
        per_token = per_token - config.entropy_coef * ent
    # Tool responses and template glue (loss_mask = 0) are context, never targets: they leave the loss here.
    per_token = per_token * mb.loss_mask
    loss = (per_token * mb.weight).sum()
    with torch.no_grad():
        on = mb.loss_mask > 0
        w = mb.weight * mb.loss_mask
        low = ((ratio < 1 - config.clip_eps) & (mb.adv < 0) & on).sum()
        high = ((ratio > 1 + config.clip_eps_high) & (mb.adv > 0) & on).sum()
        # KL and entropy are diagnostics: plain means over the sampled tokens this update forwarded,
        # so that skipped zero-advantage rows (which are in the loss weights' denominator) do not dilute them
        parts = [loss, (pg * w).sum(), (kl_tok * mb.loss_mask).sum(), (ent * mb.loss_mask).sum(), low, high,
                 (ratio * mb.loss_mask).sum(), mb.loss_mask.sum()]
    return loss, [p.detach().double() for p in parts]


def fill_ref_logprobs(model, mbs: list[MicroBatch], config: LossSettings, *, context=None,
                      on_micro_batch: Callable[[], None] | None = None) -> None:
    """Reference log-probs for every micro-batch, once per step (the reference never changes).

    model: a scorer (accel.policy_scorer); context: entered around the passes (peft's
    disable_adapter() when the reference is the base without the adapter, the accelerator's
    autocast for a separately loaded reference)."""
    _fill_logprobs(model, mbs, config, "ref", context, on_micro_batch)


def fill_old_logprobs(model, mbs: list[MicroBatch], config: LossSettings, *,
                      on_micro_batch: Callable[[], None] | None = None) -> None:
    """`--old-logprobs recompute`: the policy's own log-probs before the update stand in for the sampler's."""
    _fill_logprobs(model, mbs, config, "old", None, on_micro_batch)


def _fill_logprobs(model, mbs: list[MicroBatch], config: LossSettings, attr: str, context,
                   on_micro_batch: Callable[[], None] | None = None) -> None:
    import torch
    with torch.no_grad(), context if context is not None else contextlib.nullcontext():
        for mb in mbs:
            setattr(mb, attr, model(mb.input_ids, mb.attention_mask, mb.rows, mb.cols, mb.targets,
                                    temperature=config.temperature)[0].float())
            if on_micro_batch is not None:
                on_micro_batch()


def make_optimizer(model, lr: float, weight_decay: float = 0.0, state: dict | None = None, source: str = "-"):
    """AdamW over the trainable parameters; `state` continues a saved run (lr/decay as given).

    Under accelerate the state is loaded after `prepare` instead (accel.load_optimizer_state),
    once the parameters have their final (possibly sharded) form."""
    import torch

    from atomcli.train import accel
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    accel.load_optimizer_state(None, optimizer, state, source)
    return optimizer
