"""Stage `grpo-step`: one GRPO policy update from a rewarded table (DESIGN.md §6).

For trajectory i the model reads `prompt_ids + completion_ids` and is scored only on the
completion tokens with `loss_mask = 1` (what the policy sampled); tool responses and
template glue are context, never targets. Per scored token:

    r    = exp(logp - old_logprobs)                   (old_logprobs from the rollout, or recomputed)
    loss = -min(r·A, clip(r, 1-eps, 1+eps_high)·A) + beta·k3 - entropy_coef·H
    k3   = exp(ref - logp) - (ref - logp) - 1

aggregated as a token-mean over the whole batch (default) or a mean over trajectories of
per-trajectory token means. Micro-batches accumulate gradients weighted by the *global*
token (or trajectory) count, so the gradient equals the full-batch gradient whatever the
micro-batch size or the number of processes. Under torchrun / accelerate launch (WORLD_SIZE
> 1) every rank reads the whole table, trains on every world-th trajectory, and the summed
gradients are all-reduced before clipping and the AdamW step, which is then identical on
every rank. The optimizer state travels with the checkpoint (atomcli.checkpoint), so
consecutive calls continue one AdamW run.

`--old-logprobs recompute` replaces the table's sampling log-probs by the policy's own before
this update (one no-grad forward pass, as TRL does when it does not keep the sampler's): for
rollouts from a server that returned text only (their `old_logprobs` are NaN), or to ignore
sampler/trainer numeric drift. The first ratio is then exactly 1.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

from atomcli.config import opt
from atomcli.errors import InputError, unknown_choice

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps a stale or corrupt old_logprob from producing inf


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
    max_grad_norm: float = opt(1.0, "gradient norm clip (0 = no clipping)")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    temperature: float = opt(1.0, "logits are divided by this; must match the rollout's sampling temperature")
    old_logprobs: str = opt("rollout", "the ratio's denominator: rollout (the table's old_logprobs) or recompute "
                                       "(the policy's own before this update; for text-only servers' rollouts)")
    gradient_checkpointing: bool = opt(True, "recompute activations in the backward pass (less memory, ~30% more time)")
    lora: bool = opt(False, "train a LoRA adapter (peft) instead of all weights")
    lora_r: int = opt(16, "LoRA rank")
    skip_zero_advantage: bool = opt(True, "with beta = 0 and no entropy term, do not forward/backward rows whose "
                                          "advantage is 0 (exact: their gradient is 0; the loss denominators keep them)")
    seed: int = opt(0, "random seed")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run")


def skips_zero_rows(config: "GRPOConfig") -> bool:
    """Zero-advantage rows add exactly nothing to the gradient only without the KL and entropy terms."""
    return config.skip_zero_advantage and config.beta == 0 and config.entropy_coef == 0


# --- the batch: validated token columns ---------------------------------------------------------

@dataclass
class Trajectory:
    """One row, trimmed to what the loss needs: tokens after the last sampled one are never read."""
    row: int
    input_ids: list[int]   # prompt + completion up to (not including) the last sampled token
    positions: list[int]   # index in input_ids of the hidden state predicting each sampled token
    targets: list[int]     # the sampled tokens
    old: list[float]       # their sampling log-probs
    advantage: float


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


def read_batch(table, source: str = "-", *, recompute_old: bool = False, skip_zero: bool = False) -> Batch:
    """Validate the token columns and advantages; InputError names the row and column.

    With recompute_old the table's old log-probs are not read (they may be NaN): 0.0 stands in
    until `fill_old_logprobs` replaces them. With skip_zero, rows whose advantage is exactly 0
    are validated and counted in both denominators but not kept: with beta = 0 and no entropy
    term their loss is -min(r*0, clip(r)*0) = 0 for every token, so their gradient is exactly 0
    and a forward/backward pass over them is wasted (in a GRPO batch, every zero-variance group)."""
    cols = {c: table.column(c).to_pylist() for c in ("prompt_ids", "completion_ids", "loss_mask",
                                                      "old_logprobs", "advantage")}
    trajs, n_tokens, max_id, n_seqs, skipped, skipped_tokens = [], 0, -1, 0, 0, 0
    for i in range(table.num_rows):
        prompt, comp, mask, old = (cols[c][i] for c in ("prompt_ids", "completion_ids", "loss_mask", "old_logprobs"))
        adv = cols["advantage"][i]
        for name, seq in (("loss_mask", mask), ("old_logprobs", old)):
            if len(seq) != len(comp):
                raise InputError(f"`{name}` has {len(seq)} entries but `completion_ids` has {len(comp)}",
                                 file=source, row=i, column=name, hint="token columns must align one to one")
        if not prompt:
            raise InputError("`prompt_ids` is empty", file=source, row=i, column="prompt_ids",
                             hint="the first completion token needs a prompt to be predicted from")
        if adv is None or not math.isfinite(adv):
            raise InputError(f"advantage is {adv}", file=source, row=i, column="advantage",
                             hint="re-run `atom aggregate-reward`; a NaN/inf advantage would poison the update")
        if any(m not in (0, 1) for m in mask):
            raise InputError("`loss_mask` values must be 0 or 1", file=source, row=i, column="loss_mask")
        idx = [j for j, m in enumerate(mask) if m]
        if not idx:
            continue
        if recompute_old:
            old = [0.0] * len(comp)
        elif (bad := next((j for j in idx if old[j] is None or not math.isfinite(old[j])), None)) is not None:
            raise InputError(f"old log-prob of sampled token {bad} is {old[bad]}", file=source, row=i,
                             column="old_logprobs", hint="sampled tokens need finite log-probs; rollouts from a "
                             "text-only server have none: pass --old-logprobs recompute")
        p = len(prompt)
        ids = list(prompt) + list(comp[:idx[-1]])
        max_id = max(max_id, max(prompt), max(comp[:idx[-1] + 1]))
        if min(prompt) < 0 or min(comp[:idx[-1] + 1]) < 0:
            raise InputError("negative token id", file=source, row=i, column="completion_ids")
        n_tokens += len(idx)
        n_seqs += 1
        if skip_zero and adv == 0:
            skipped, skipped_tokens = skipped + 1, skipped_tokens + len(idx)
            continue
        trajs.append(Trajectory(i, ids, [p + j - 1 for j in idx], [comp[j] for j in idx],
                                [old[j] for j in idx], float(adv)))
    if not n_tokens:
        raise InputError("no sampled tokens to train on (every loss_mask is 0)", file=source,
                         column="loss_mask", hint="check the output of `atom rollout`")
    stats = _column_stats(table, cols["advantage"])
    return Batch(trajs, table.num_rows, n_tokens, max_id, stats, n_seqs, skipped, skipped_tokens)


def _column_stats(table, adv) -> dict:
    def mean_std(xs):
        xs = [float(x) for x in xs if x is not None and math.isfinite(x)]
        if not xs:
            return None, None
        m = sum(xs) / len(xs)
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))
    out = {}
    out["advantage_mean"], out["advantage_std"] = mean_std(adv)
    if "reward" in table.column_names:
        out["reward_mean"], out["reward_std"] = mean_std(table.column("reward").to_pylist())
    return out


# --- distributed ----------------------------------------------------------------------------------

@dataclass
class World:
    rank: int = 0
    size: int = 1
    comm_device: str = "cpu"  # where collectives run: NCCL only reduces CUDA tensors

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, tensor):
        """Sum over ranks (in place where possible); identity in a single process."""
        if self.size > 1:
            import torch.distributed as dist
            moved = tensor.to(self.comm_device)
            dist.all_reduce(moved, op=dist.ReduceOp.SUM)
            if moved is not tensor:
                tensor.copy_(moved)
        return tensor


def init_world() -> World:
    """Join the process group torchrun / accelerate launch set up (env://); one process otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    import atexit

    import torch
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
    comm = f"cuda:{_device_index(dist.get_rank())}" if dist.get_backend() == "nccl" else "cpu"
    return World(dist.get_rank(), dist.get_world_size(), comm)


def _device_index(rank: int) -> int:
    import torch
    return int(os.environ.get("LOCAL_RANK", rank)) % max(torch.cuda.device_count(), 1)


def _device(world: World):
    import torch
    if torch.cuda.is_available():
        return torch.device("cuda", _device_index(world.rank))
    return torch.device("cpu")


# --- micro-batches --------------------------------------------------------------------------------

@dataclass
class MicroBatch:
    input_ids: object       # [b, L] right-padded
    attention_mask: object  # [b, L]
    rows: object            # [n] which sequence each scored token belongs to
    cols: object            # [n] position of the hidden state that predicts it
    targets: object         # [n]
    old: object             # [n]
    adv: object             # [n] the trajectory's advantage, per token
    weight: object          # [n] the token's share of the aggregated loss
    n_input_tokens: int
    ref: object = None      # [n] reference log-probs, filled when beta > 0


def micro_batches(batch: Batch, config: GRPOConfig, world: World, device, pad_id: int = 0) -> list[MicroBatch]:
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
        rows, cols, targets, old, adv, weight = [], [], [], [], [], []
        for b, t in enumerate(chunk):
            ids[b, :len(t.input_ids)] = torch.tensor(t.input_ids, dtype=torch.long)
            att[b, :len(t.input_ids)] = 1
            n = len(t.targets)
            rows += [b] * n
            cols += t.positions
            targets += t.targets
            old += t.old
            adv += [t.advantage] * n
            w = 1.0 / batch.n_tokens if config.loss_agg == "token-mean" else 1.0 / (n * n_seqs)
            weight += [w] * n
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        as_float = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
        out.append(MicroBatch(ids.to(device), att.to(device), as_long(rows), as_long(cols), as_long(targets),
                              as_float(old), as_float(adv), as_float(weight), int(att.sum())))
    return out


# --- the update -----------------------------------------------------------------------------------

STAT_NAMES = ("loss", "pg_loss", "kl", "entropy", "clip_low", "clip_high", "ratio", "tokens")


def grpo_update(model, optimizer, mbs: list[MicroBatch], config: GRPOConfig, world: World,
                zero_fill: bool = False) -> dict:
    """One optimizer step over the whole (global) batch. Returns the batch-level metrics.

    zero_fill: rows were skipped (read_batch skip_zero), so a parameter that got no gradient
    gets an explicit 0, as the full pass would have given it: AdamW then advances its moments
    exactly as in the full update (a None gradient would leave them untouched)."""
    import torch

    from atomcli.token_logprobs import sequence_logprobs
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    stats = torch.zeros(len(STAT_NAMES), dtype=torch.float64)
    t0 = time.perf_counter()
    for mb in mbs:
        logp, ent = sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.rows, mb.cols, mb.targets,
                                      config.temperature)
        loss, parts = grpo_token_loss(logp, ent, mb, config)
        loss.backward()
        stats += torch.stack(parts).cpu()
    stats = world.all_sum(stats)
    if zero_fill:
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    if world.size > 1:
        _all_reduce_grads(params, world)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    skipped = not math.isfinite(grad_norm)
    if skipped:  # a NaN/inf gradient would destroy the weights: keep them, say so
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - t0
    m = dict(zip(STAT_NAMES, stats.tolist()))
    tokens = world.all_sum(torch.tensor([sum(mb.n_input_tokens for mb in mbs)], dtype=torch.float64)).item()
    for k in ("clip_low", "clip_high", "ratio"):
        m[k] /= max(m["tokens"], 1)  # plain fractions / means over sampled tokens
    m.update(grad_norm=grad_norm, skipped=skipped, seconds=seconds, input_tokens=int(tokens),
             trained_tokens=int(m.pop("tokens")), tokens_per_s=tokens / seconds if seconds > 0 else None)
    return m


def grpo_token_loss(logp, ent, mb: MicroBatch, config: GRPOConfig):
    """The micro-batch's share of the loss, and its share of each metric (as weighted sums)."""
    import torch
    log_ratio = (logp - mb.old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps_high)
    pg = -torch.min(ratio * mb.adv, clipped * mb.adv)
    per_token = pg
    kl = logp.new_zeros(())
    if config.beta > 0:
        d = (mb.ref - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl_tok = d.exp() - d - 1
        per_token = per_token + config.beta * kl_tok
        kl = (kl_tok * mb.weight).sum()
    if config.entropy_coef > 0:
        per_token = per_token - config.entropy_coef * ent
    loss = (per_token * mb.weight).sum()
    with torch.no_grad():
        low = ((ratio < 1 - config.clip_eps) & (mb.adv < 0)).sum()
        high = ((ratio > 1 + config.clip_eps_high) & (mb.adv > 0)).sum()
        parts = [loss, (pg * mb.weight).sum(), kl, (ent * mb.weight).sum(), low, high, ratio.sum(),
                 logp.new_tensor(float(logp.numel()))]
    return loss, [p.detach().double() for p in parts]


def _all_reduce_grads(params, world: World, bucket: int = 1 << 24) -> None:
    """Sum gradients over ranks in flat buckets (fewer, larger messages than one per tensor)."""
    import torch
    for p in params:
        if p.grad is None:  # a rank whose trajectories never reached this parameter
            p.grad = torch.zeros_like(p)
    group, size = [], 0
    for p in params + [None]:
        if p is not None:
            group.append(p)
            size += p.numel()
        if group and (p is None or size >= bucket):
            flat = world.all_sum(torch.cat([q.grad.reshape(-1) for q in group]))
            offset = 0
            for q in group:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
                offset += q.numel()
            group, size = [], 0



def fill_ref_logprobs(model, mbs: list[MicroBatch], config: GRPOConfig, *, disable_adapter: bool = False) -> None:
    """Reference log-probs for every micro-batch, once per step (the reference never changes)."""
    _fill_logprobs(model, mbs, config, "ref", disable_adapter)


def fill_old_logprobs(model, mbs: list[MicroBatch], config: GRPOConfig) -> None:
    """`--old-logprobs recompute`: the policy's own log-probs before the update stand in for the sampler's."""
    _fill_logprobs(model, mbs, config, "old", False)


def _fill_logprobs(model, mbs: list[MicroBatch], config: GRPOConfig, attr: str, disable_adapter: bool) -> None:
    import contextlib

    import torch

    from atomcli.token_logprobs import sequence_logprobs
    ctx = model.disable_adapter() if disable_adapter else contextlib.nullcontext()
    with torch.no_grad(), ctx:
        for mb in mbs:
            setattr(mb, attr, sequence_logprobs(model, mb.input_ids, mb.attention_mask, mb.rows, mb.cols,
                                                mb.targets, config.temperature)[0])


def make_optimizer(model, config: GRPOConfig, state: dict | None = None, source: str = "-"):
    """AdamW over the trainable parameters; `state` continues a saved run (lr/decay from config)."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
    if state is not None:
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as e:
            raise InputError(f"optimizer.pt does not match the model ({str(e).splitlines()[0][:120]})", file=source,
                             hint="was it written with a different --lora setting or model?") from None
        for g in optimizer.param_groups:  # the saved state keeps its moments; the flags set the schedule
            g["lr"], g["weight_decay"] = config.lr, config.weight_decay
    return optimizer


# --- the stage ------------------------------------------------------------------------------------

def run(table, config: GRPOConfig, context):
    """One GRPO step on `table`; returns a checkpoint.TrainResult (cli saves it)."""
    _check_config(config)
    batch = read_batch(table, recompute_old=config.old_logprobs == "recompute",  # fails before heavy imports
                       skip_zero=skips_zero_rows(config))

    import torch

    from atomcli import checkpoint, models
    world = init_world()
    if not world.main:  # one voice per job: the other ranks only compute
        context.quiet = True
    device = _device(world)
    torch.manual_seed(config.seed)

    policy = _load_policy(config, checkpoint.read_state(config.model), context, device, context.log)
    model, tok = policy.model, policy.tokenizer
    _check_tokens(table, batch, model, tok, context.log, config.temperature)

    mbs = micro_batches(batch, config, world, device, pad_id=tok.pad_token_id or 0)
    local = torch.tensor([float(sum(mb.targets.numel() for mb in mbs))], dtype=torch.float64)
    if world.all_sum(local).item() != batch.n_tokens - batch.skipped_tokens:
        raise RuntimeError("ranks read different tables (sampled-token counts disagree)")

    t0 = time.perf_counter()
    prepare_for_training(model, config)
    if config.old_logprobs == "recompute":
        fill_old_logprobs(model, mbs, config)
    if config.beta > 0:
        if policy.ref_is_adapter_off:
            fill_ref_logprobs(model, mbs, config, disable_adapter=True)
        elif policy.ref == policy.start and policy.step == 1:
            fill_ref_logprobs(model, mbs, config)  # the run's first step: the policy *is* the reference
        else:
            ref_model, _ = models.load(policy.ref, context, trust_remote_code=config.trust_remote_code,
                                       device=str(device))
            fill_ref_logprobs(ref_model, mbs, config)
            del ref_model  # freed before the backward passes need the memory
    ref_seconds = time.perf_counter() - t0

    optimizer = make_optimizer(model, config, policy.optimizer_state, source=config.model)
    updates = [grpo_update(model, optimizer, mbs, config, world, zero_fill=batch.skipped > 0)
               for _ in range(config.epochs)]
    finish_training(model, config)

    metrics = {**updates[0], "ref_seconds": ref_seconds, "step": policy.step, "n_trajectories": batch.n_rows,
               "skipped_zero_advantage": batch.skipped, "skipped_tokens": batch.skipped_tokens,
               "lr": config.lr, "world_size": world.size, "peak_rss_mb": _peak_rss_mb(), **batch.stats}
    if len(updates) > 1:
        metrics["last_update"] = updates[-1]
    metrics["updates"] = updates
    if torch.cuda.is_available():
        metrics["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if world.main:
        _summary(context, metrics)
    return checkpoint.TrainResult(
        model=model, tokenizer=tok, step=policy.step, metrics=metrics, base=policy.start, lora=config.lora,
        lora_base=policy.lora_base, optimizer_state=optimizer.state_dict(), ref=policy.ref,
        extra={"updates": policy.updates_before + sum(not u["skipped"] for u in updates)})


def _check_config(config: GRPOConfig) -> None:
    if config.loss_agg not in ("token-mean", "seq-mean"):
        raise InputError(f"unknown loss aggregation `{config.loss_agg}`", hint="valid: seq-mean, token-mean")
    if config.old_logprobs not in ("rollout", "recompute"):
        raise unknown_choice("--old-logprobs source", config.old_logprobs, ("rollout", "recompute"))
    for name in ("micro_batch", "epochs", "lora_r"):
        if getattr(config, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("clip_eps", "clip_eps_high", "beta", "entropy_coef", "max_grad_norm", "weight_decay"):
        if not getattr(config, name) >= 0:
            raise InputError(f"--{name.replace('_', '-')} must be >= 0")
    if not config.temperature > 0 or not config.lr > 0:
        raise InputError("--temperature and --lr must be > 0")


@dataclass
class Policy:
    """The model to train and what the checkpoint says about where this run started."""
    model: object
    tokenizer: object
    optimizer_state: dict | None
    start: str               # the checkpoint this call starts from (spec id)
    ref: str                 # the run's reference checkpoint
    ref_is_adapter_off: bool  # LoRA: the reference is the base with the adapter disabled
    lora_base: str | None
    step: int                # this call's GRPO step number in the run (1 = first)
    updates_before: int


def _load_policy(config: GRPOConfig, state: dict, context, device, log) -> Policy:
    from atomcli import checkpoint, models
    start = checkpoint.spec_id(config.model)
    continuing = state.get("stage") == "grpo-step"
    kw = dict(trust_remote_code=config.trust_remote_code, device=str(device))
    lora_base = None
    if config.lora:
        from peft import LoraConfig, PeftModel, get_peft_model
        if state.get("lora") and checkpoint.adapter_dir(config.model).is_dir():
            # keep training the saved adapter on top of the base it was trained on
            lora_base = state["lora_base"]
            base, tok = models.load(lora_base, context, **kw)
            model = PeftModel.from_pretrained(base, str(checkpoint.adapter_dir(config.model)), is_trainable=True)
        else:
            lora_base = start
            base, tok = models.load(config.model, context, **kw)
            model = get_peft_model(base, LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, lora_dropout=0.0,
                                                    target_modules="all-linear", task_type="CAUSAL_LM"))
    else:
        if state.get("lora"):
            log("[yellow]note:[/] the checkpoint holds a LoRA adapter; without --lora its merged weights are "
                "trained and the optimizer starts fresh")
        model, tok = models.load(config.model, context, **kw)
    same_kind = continuing and bool(state.get("lora")) == config.lora
    opt_state = checkpoint.read_optimizer_state(config.model) if same_kind else None
    if continuing and opt_state is None:
        log("[yellow]note:[/] no matching optimizer state in the checkpoint; AdamW starts fresh")
    if config.ref:
        ref = checkpoint.spec_id(config.ref)
    elif config.lora:
        ref = lora_base
    else:
        ref = state.get("ref") if continuing and state.get("ref") else start
    return Policy(model, tok, opt_state, start, ref, config.lora and not config.ref, lora_base,
                  int(state.get("step", 0)) + 1 if continuing else 1,
                  int(state.get("updates", 0)) if continuing else 0)


def _check_tokens(table, batch: Batch, model, tok, log, config_temperature: float = 1.0) -> None:
    """The token columns must belong to this model's tokenizer and fit its embedding table."""
    from atomcli import models, schema
    rec = schema.token_source(table)
    mine = models.tokenizer_id(tok)
    if rec is None:
        log("[yellow]note:[/] the table does not name the tokenizer of its token columns; assuming the model's")
    elif rec["tokenizer"] != mine:
        raise InputError(f"token columns were made with tokenizer {rec['tokenizer']} (by `{rec.get('stage')}`, "
                         f"model {rec.get('model', '?')}), the policy's is {mine}", column="completion_ids",
                         hint="train the policy that produced the rollouts")
    vocab = model.get_input_embeddings().num_embeddings
    if batch.max_id >= vocab:
        raise InputError(f"token id {batch.max_id} is outside the model's vocabulary ({vocab})",
                         column="completion_ids", hint="the table was made with another model")
    for rec in reversed(schema.provenance(table)):
        if rec.get("stage") == "rollout":
            t = (rec.get("config") or {}).get("temperature")
            if isinstance(t, (int, float)) and t > 0 and abs(t - config_temperature) > 1e-9:
                log(f"[yellow]note:[/] the rollout sampled at temperature {t}; pass --temperature {t} "
                    "so the ratios start at 1")
            break


def prepare_for_training(model, config: GRPOConfig) -> None:
    import torch
    # train mode so gradient checkpointing engages; dropout off so the first ratio is exactly 1
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if config.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2 name (non-reentrant)
            model.activation_checkpointing_enable()
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def finish_training(model, config: GRPOConfig) -> None:
    if config.gradient_checkpointing:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    model.eval()


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _summary(context, m: dict) -> None:
    from rich.table import Table
    t = Table(title=f"grpo-step {m['step']}", show_header=False, box=None, pad_edge=False)
    fmt = lambda v: "-" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
    for label, key in (("loss", "loss"), ("pg loss", "pg_loss"), ("kl", "kl"), ("entropy", "entropy"),
                       ("clip low/high", None), ("grad norm", "grad_norm"), ("reward mean/std", None),
                       ("trajectories / trained tokens", None), ("tokens/s", "tokens_per_s"),
                       ("peak RSS MB", "peak_rss_mb")):
        if key:
            val = fmt(m.get(key))
        elif label.startswith("clip"):
            val = f"{m['clip_low']:.3f} / {m['clip_high']:.3f}"
        elif label.startswith("reward"):
            val = f"{fmt(m.get('reward_mean'))} / {fmt(m.get('reward_std'))}"
        else:
            val = f"{m['n_trajectories']} / {m['trained_tokens']}"
        t.add_row(label, val)
    if m.get("skipped"):
        t.add_row("[red]skipped[/]", "non-finite gradient norm: weights unchanged")
    context.console.print(t)
