"""Stage `grpo-step`: one GRPO policy update from a rewarded table (docs/design.md, "The GRPO update").

For trajectory i the model reads `prompt_ids + completion_ids` and is scored only on the
completion tokens with `loss_mask = 1` (what the policy sampled); tool responses and
template glue are context, never targets. Per scored token:

    r    = exp(logp - old_logprobs)                   (old_logprobs from the rollout, or recomputed)
    loss = -min(r·A, clip(r, 1-eps, 1+eps_high)·A) + beta·k3 - entropy_coef·H
    k3   = exp(ref - logp) - (ref - logp) - 1

A is the row's `advantage`, or, when the table has `turn_advantages` (aggregate-reward
--credit turn), the advantage of the assistant turn the token belongs to: turn k is the k-th
run of 1s in `loss_mask`, and a row whose `turn_advantages` is null falls back to `advantage`.
Aggregated as a token-mean over the whole batch (default) or a mean over trajectories of
per-trajectory token means. Micro-batches accumulate gradients weighted by the *global*
token (or trajectory) count, so the gradient equals the full-batch gradient whatever the
micro-batch size or the number of processes.

Model and AdamW are prepared with `accelerate.Accelerator` (atomcli.train.accel), so the same
command runs in one process (`python -m atomcli grpo-step`) or under `accelerate launch` /
torchrun with the user's accelerate config: DDP, FSDP (FSDP2) or DeepSpeed, no collectives of
its own. Every rank reads the whole table and trains on every world-th trajectory; ranks with
fewer micro-batches (after skipping zero-advantage rows) add weight-0 passes so that all run as
many; the gradients are synchronized once, clipped with `accelerator.clip_grad_norm_` and the
AdamW step is the same everywhere. `--precision auto|bf16|fp32` sets the mixed precision (auto:
bf16 on a GPU, fp32 on CPU); the weights and AdamW state stay fp32. The optimizer state travels
with the checkpoint (atomcli.checkpoint), gathered from the ranks into one full file, so
consecutive calls continue one AdamW run whatever the launch. On CPU (gloo) one process and DDP
run; accelerate 1.15 enables FSDP and DeepSpeed only on GPU launches (on CPU it runs DDP and
says so; the FSDP2 path is tested on CPU only with accelerate's state forced by the test), DeepSpeed
has never run, nothing has run on a GPU, and LoRA under FSDP is refused: see atomcli.train.accel.

In run-all the policy comes from memory rather than from the `--model` folder when the context's
resident policy stands for it (atomcli.train.resident): the module, AdamW state and atom_state are
the ones that folder holds or would hold, the update continues them in place, and a separately
loaded reference is kept there for the next step.

`--old-logprobs recompute` replaces the table's sampling log-probs by the policy's own before
this update (one no-grad forward pass, as TRL does when it does not keep the sampler's): for
rollouts from a server that returned text only (their `old_logprobs` are NaN), or to ignore
sampler/trainer numeric drift. The first ratio is then exactly 1.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from atomcli.agent.episode import turn_spans
from atomcli.config import opt
from atomcli.errors import InputError, unknown_choice
from atomcli.train import checkpointing
from atomcli.train.grpo import (Batch, LossSettings, Trajectory, World, fill_old_logprobs, fill_ref_logprobs,
                                grpo_update, make_optimizer, micro_batches)


@dataclass
class GRPOConfig:
    model: str = opt("smollm2", "policy checkpoint to update")
    ref: str = opt("", "reference checkpoint for the KL term (default: the run's starting checkpoint)")
    lr: float = opt(1e-6, "learning rate (AdamW, constant)")
    beta: float = opt(0.001, "KL coefficient (k3 estimator); 0 disables the reference model")
    clip_eps: float = opt(0.2, "lower clip epsilon", advanced=True)
    clip_eps_high: float = opt(0.2, "upper clip epsilon (DAPO clip-higher when > clip-eps)", advanced=True)
    entropy_coef: float = opt(0.0, "entropy bonus coefficient. DeepResearcher's published 7B config uses 0.001; "
                                   "the default is 0 because any entropy term makes every zero-advantage row "
                                   "carry gradient (no skipping of zero-variance groups); entropy is logged every "
                                   "step so a collapse shows; set 0.001 to follow the paper", advanced=True)
    loss_agg: str = opt("token-mean", "loss aggregation: token-mean or seq-mean", advanced=True)
    micro_batch: int = opt(4, "trajectories per forward/backward (gradient accumulation)")
    epochs: int = opt(1, "updates per batch")
    max_grad_norm: float = opt(1.0, "gradient norm clip (0 = no clipping)", advanced=True)
    weight_decay: float = opt(0.0, "AdamW weight decay", advanced=True)
    temperature: float = opt(1.0, "logits are divided by this; rollouts record old_logprobs at 1 (the raw logits) "
                                  "whatever they sampled at, so another value needs --old-logprobs recompute",
                             advanced=True)
    old_logprobs: str = opt("rollout", "the ratio's denominator: rollout (the table's old_logprobs) or recompute "
                                       "(the policy's own before this update; for text-only servers' rollouts)",
                            advanced=True)
    precision: str = opt("auto", "mixed precision: bf16 or fp32 (auto: bf16 on a GPU that supports it, else fp32); "
                                 "weights and optimizer state stay fp32", advanced=True)
    gradient_checkpointing: bool = opt(True, "recompute activations in the backward pass (less memory, more time)",
                                       advanced=True)
    lora: bool = opt(False, "train a LoRA adapter (peft) instead of all weights")
    lora_r: int = opt(16, "LoRA rank", advanced=True)
    skip_zero_advantage: bool = opt(True, "with beta = 0 and no entropy term, do not forward/backward rows whose "
                                          "advantage is 0 (exact: their gradient is 0; the loss denominators keep them)",
                                    advanced=True)
    seed: int = opt(0, "random seed")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run", advanced=True)


def loss_settings(config: "GRPOConfig") -> LossSettings:
    """The loss math's own settings, from this stage's config."""
    return LossSettings(clip_eps=config.clip_eps, clip_eps_high=config.clip_eps_high, beta=config.beta,
                        entropy_coef=config.entropy_coef, loss_agg=config.loss_agg, temperature=config.temperature,
                        micro_batch=config.micro_batch, max_grad_norm=config.max_grad_norm)


def skips_zero_rows(config: "GRPOConfig") -> bool:
    """Zero-advantage rows add exactly nothing to the gradient only without the KL and entropy terms."""
    return config.skip_zero_advantage and config.beta == 0 and config.entropy_coef == 0


# --- the batch: validated token columns ---------------------------------------------------------

def read_batch(table, source: str = "-", *, recompute_old: bool = False, skip_zero: bool = False) -> Batch:
    """Validate the token columns and advantages; InputError names the row and column.

    With recompute_old the table's old log-probs are not read (they may be NaN): 0.0 stands in
    until `fill_old_logprobs` replaces them. With skip_zero, rows whose advantage is exactly 0
    are validated and counted in both denominators but not kept: with beta = 0 and no entropy
    term their loss is -min(r*0, clip(r)*0) = 0 for every token, so their gradient is exactly 0
    and a forward/backward pass over them is wasted (in a GRPO batch, every zero-variance group).
    With `turn_advantages` a row is skipped only when every sampled token's advantage is 0."""
    cols = {c: table.column(c).to_pylist() for c in ("prompt_ids", "completion_ids", "loss_mask",
                                                      "old_logprobs", "advantage")}
    turn_col = table.column("turn_advantages").to_pylist() if "turn_advantages" in table.column_names else None
    n_turn_rows = 0
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
        last = idx[-1] + 1
        token_adv = None
        if turn_col is not None and turn_col[i] is not None:
            token_adv = _token_advantages(turn_col[i], mask, last, source, i)
            n_turn_rows += 1
        n_tokens += len(idx)
        n_seqs += 1
        if skip_zero and (all(token_adv[j] == 0 for j in idx) if token_adv is not None else adv == 0):
            skipped, skipped_tokens = skipped + 1, skipped_tokens + len(idx)
            continue
        trajs.append(Trajectory(i, ids, p - 1, list(comp[:last]), list(mask[:last]),
                                [old[j] if mask[j] else 0.0 for j in range(last)], float(adv), token_adv))
    if not n_tokens:
        raise InputError("no sampled tokens to train on (every loss_mask is 0)", file=source,
                         column="loss_mask", hint="check the output of `atom rollout`")
    stats = _column_stats(table, cols["advantage"])
    stats["credit"] = "turn" if n_turn_rows else "trajectory"
    stats["turn_credit_rows"] = n_turn_rows
    return Batch(trajs, table.num_rows, n_tokens, max_id, stats, n_seqs, skipped, skipped_tokens)


def _token_advantages(turn_adv: list, mask: list[int], last: int, source: str, row: int) -> list[float]:
    """Each of the first `last` completion tokens gets the advantage of the turn (run of 1s in `loss_mask`)
    it belongs to; tokens between turns (mask 0) get 0.0, which the loss never reads."""
    spans = turn_spans(mask)
    if len(turn_adv) != len(spans):
        raise InputError(f"`turn_advantages` has {len(turn_adv)} values but `loss_mask` has {len(spans)} turns "
                         "(runs of sampled tokens)", file=source, row=row, column="turn_advantages",
                         hint="re-run `atom aggregate-reward --credit turn` on this rollout table")
    if not all(a is not None and math.isfinite(a) for a in turn_adv):
        raise InputError("`turn_advantages` holds a null or non-finite value", file=source, row=row,
                         column="turn_advantages", hint="re-run `atom aggregate-reward`")
    out = [0.0] * last
    for (start, end), a in zip(spans, turn_adv):
        out[start:min(end, last)] = [float(a)] * (min(end, last) - start)
    return out


def _column_stats(table, adv) -> dict:
    from atomcli.stats import mean_std
    out = {}
    out["advantage_mean"], out["advantage_std"] = mean_std(adv)
    if "reward" in table.column_names:
        out["reward_mean"], out["reward_std"] = mean_std(table.column("reward").to_pylist())
    return out


# --- the stage ------------------------------------------------------------------------------------

def run(table, config: GRPOConfig, context):
    """One GRPO step on `table`; returns a checkpoint.TrainResult (cli saves it)."""
    _check_config(config)
    batch = read_batch(table, recompute_old=config.old_logprobs == "recompute",  # fails before heavy imports
                       skip_zero=skips_zero_rows(config))

    import torch

    from atomcli import checkpoint, models
    from atomcli.train import accel
    accelerator = accel.make_accelerator(config.precision)
    _check_launch(accelerator, config)
    world = World(accelerator.process_index, accelerator.num_processes)
    if not world.main:  # one voice per job: the other ranks only compute
        context.quiet = True
    if (note := accel.requested_but_not_run(accelerator)) is not None:
        context.log(f"[yellow]note:[/] {note}")
    device = accelerator.device
    torch.manual_seed(config.seed)

    # run-all's resident policy stands for config.model: continue it in memory (atomcli.train.resident)
    resident = context.resident if context.resident is not None and context.resident.stands_for(config.model) else None
    if resident is not None and world.size > 1:
        raise InputError("run-all's in-memory policy trains in one process",
                         hint="launch the stages one by one under accelerate launch (docs/scale.md)")
    policy = (_resident_policy(config, resident) if resident is not None
              else _load_policy(config, checkpoint.read_state(config.model), context, device, context.log))
    model, tok = policy.model, policy.tokenizer
    _check_tokens(table, batch, model, tok, context.log)
    if note := temperature_note(config.temperature, config.old_logprobs):
        context.log(f"[yellow]note:[/] {note}")

    loss = loss_settings(config)
    pad_id = tok.pad_token_id or 0
    mbs = micro_batches(batch, loss, world, device, pad_id=pad_id)
    if warning := _check_memory(model, mbs, config, policy):
        context.log(f"[yellow]note:[/] {warning}")
    local = torch.tensor([float(sum(mb.loss_mask.sum().item() for mb in mbs))], dtype=torch.float64)
    if accel.all_sum(accelerator, local).item() != batch.n_tokens - batch.skipped_tokens:
        raise RuntimeError("ranks read different tables (sampled-token counts disagree)")
    mbs = accel.pad_micro_batches(accelerator, mbs, device, pad_id)  # the same number of passes on every rank

    from atomcli.progress import Progress
    passes = len(mbs) * (config.epochs + (config.old_logprobs == "recompute") + (config.beta > 0))
    with Progress(context, f"grpo-step {policy.step}", passes, "micro-batches") as progress:
        tick = progress.advance
        t0 = time.perf_counter()
        prepare_for_training(model, config)
        optimizer = make_optimizer(model, config.lr, config.weight_decay)
        scorer, optimizer = accelerator.prepare(accel.policy_scorer(model), optimizer)
        if policy.optimizer_state is not None and accel.is_deepspeed(accelerator):
            context.log("[yellow]note:[/] DeepSpeed keeps AdamW's state inside its engine; it starts fresh")
        accel.load_optimizer_state(accelerator, optimizer, policy.optimizer_state, source=config.model)
        policy.optimizer_state = None  # loaded: the CPU copy read from optimizer.pt is not kept through the update
        if config.old_logprobs == "recompute":
            progress.update(info="old log-probs")
            fill_old_logprobs(scorer, mbs, loss, on_micro_batch=tick)
        if config.beta > 0:
            progress.update(info="reference log-probs")
            if policy.ref_is_adapter_off:
                fill_ref_logprobs(scorer, mbs, loss, context=model.disable_adapter(), on_micro_batch=tick)
            elif policy.ref == policy.start and policy.step == 1:
                fill_ref_logprobs(scorer, mbs, loss, on_micro_batch=tick)  # first step: the policy *is* the reference
            else:
                def load_ref(where: str | None):
                    ref_model, _ = models.load(policy.ref, context, trust_remote_code=config.trust_remote_code,
                                               device=where)
                    return ref_model.eval()
                # a lone call frees the reference before the backward passes need the memory; run-all keeps
                # it with its resident policy, in host memory between the reference passes (exact copies)
                ref_model = (resident.reference(policy.ref, lambda: load_ref(None)).to(device) if resident is not None
                             else load_ref(_device_name(device)))
                fill_ref_logprobs(accel.policy_scorer(ref_model), mbs, loss, context=accelerator.autocast(),
                                  on_micro_batch=tick)
                if resident is not None:
                    ref_model.to("cpu")
                del ref_model
        ref_seconds = time.perf_counter() - t0

        updates = []
        for epoch in range(config.epochs):
            progress.update(info=f"update {epoch + 1}/{config.epochs} (forward + backward)")
            updates.append(grpo_update(scorer, optimizer, mbs, loss, accelerator, zero_fill=batch.skipped > 0,
                                       on_micro_batch=tick))
    finish_training(model, config)
    # collectives: every rank gathers, rank 0 keeps the full weights and AdamW state
    state_dict = accel.full_state_dict(accelerator, scorer)
    optimizer_state = accel.full_optimizer_state(accelerator, optimizer)

    metrics = {**updates[0], "ref_seconds": ref_seconds, "step": policy.step, "n_trajectories": batch.n_rows,
               "skipped_zero_advantage": batch.skipped, "skipped_tokens": batch.skipped_tokens,
               "lr": config.lr, "world_size": world.size, "distributed": accelerator.distributed_type.value,
               "precision": accel.resolve_precision(config.precision), "peak_rss_mb": _peak_rss_mb(),
               **batch.stats}
    if len(updates) > 1:
        metrics["last_update"] = updates[-1]
    metrics["updates"] = updates
    if torch.cuda.is_available():
        metrics["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if world.main:
        _summary(context, metrics)
    return checkpoint.TrainResult(
        model=model, tokenizer=tok, step=policy.step, metrics=metrics, base=policy.start, lora=config.lora,
        lora_base=policy.lora_base, optimizer_state=optimizer_state, ref=policy.ref,
        extra={"updates": policy.updates_before + sum(not u["skipped"] for u in updates)}, state_dict=state_dict)


def _device_name(device) -> str:
    return "cpu" if device.type == "cpu" else str(device)


def _check_launch(accelerator, config: GRPOConfig) -> None:
    from accelerate.utils import DistributedType
    if config.lora and accelerator.distributed_type == DistributedType.FSDP:
        raise InputError("--lora is not supported under FSDP", hint="launch adapters with DDP (accelerate launch "
                         "--multi_gpu), or train all weights under FSDP")


def _check_memory(model, mbs, config: GRPOConfig, policy) -> str | None:
    """Stop before the update when its largest micro-batch cannot fit the memory available (train/memory.py); the
    check's warning when it fits only tightly."""
    from atomcli.train import accel, memory
    if not mbs:
        return None
    rows, length = max((tuple(mb.input_ids.shape) for mb in mbs), key=lambda s: s[0] * s[1])
    # with the KL term and no adapter to switch off, a reference model's weights are resident too
    ref = 4 * memory.Shape.of(model).params if config.beta > 0 and not policy.ref_is_adapter_off else 0
    return memory.check_training("grpo-step", model, batch_rows=rows, tokens_per_row=length,
                                 checkpointing=config.gradient_checkpointing,
                                 trainable_params=0 if config.lora else None,
                                 checkpointed_share=memory.GRPO_CHECKPOINTED_SHARE, extra_bytes=ref,
                                 precision=accel.resolve_precision(config.precision),
                                 hint="lower --micro-batch, turn on --gradient-checkpointing, or roll out shorter "
                                      "trajectories (--max-turns, --max-new-tokens)")


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
    from atomcli.train.accel import check_precision
    check_precision(config.precision)


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


def _resident_policy(config: GRPOConfig, resident) -> Policy:
    """The policy from run-all's memory: what _load_policy would read from the folder it stands for."""
    state = resident.state
    if bool(state.get("lora")) != config.lora:
        raise InputError("the in-memory policy was trained with another --lora setting")
    start = resident.spec
    lora_base = state.get("lora_base") if config.lora else None
    return Policy(resident.model, resident.tokenizer, resident.optimizer_state, start,
                  _ref(config, state, start, lora_base, continuing=True), config.lora and not config.ref,
                  lora_base, int(state.get("step", 0)) + 1, int(state.get("updates", 0)))


def _ref(config: GRPOConfig, state: dict, start: str, lora_base: str | None, continuing: bool) -> str:
    """The run's KL reference: --ref, else the LoRA base, else the one the checkpoint names, else `start`."""
    from atomcli import checkpoint
    if config.ref:
        return checkpoint.spec_id(config.ref)
    if config.lora:
        return lora_base
    return state.get("ref") if continuing and state.get("ref") else start


def _load_policy(config: GRPOConfig, state: dict, context, device, log) -> Policy:
    from atomcli import checkpoint, models
    start = checkpoint.spec_id(config.model)
    continuing = state.get("stage") == "grpo-step"
    kw = dict(trust_remote_code=config.trust_remote_code, device=_device_name(device))
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
    ref = _ref(config, state, start, lora_base, continuing)
    return Policy(model, tok, opt_state, start, ref, config.lora and not config.ref, lora_base,
                  int(state.get("step", 0)) + 1 if continuing else 1,
                  int(state.get("updates", 0)) if continuing else 0)


def temperature_note(temperature: float, old_logprobs: str) -> str | None:
    """A note when the ratios cannot start at 1. Rollouts record `old_logprobs` under the raw logits
    (temperature 1, whatever temperature they sampled at: the HF engine and vLLM alike), so an update that
    divides the logits by another temperature must recompute them. A rollout sampled at 0.7 and scored at 1
    is fine: both sides of the ratio are the raw policy."""
    if old_logprobs == "rollout" and abs(temperature - 1.0) > 1e-9:
        return (f"--temperature {temperature} divides the logits, but the rollout's old_logprobs are the raw "
                "logits' (temperature 1), so the ratios do not start at 1: pass --old-logprobs recompute, or "
                "--temperature 1")
    return None


def _check_tokens(table, batch: Batch, model, tok, log) -> None:
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


def prepare_for_training(model, config: GRPOConfig) -> None:
    import torch
    # train mode so gradient checkpointing engages; dropout off so the first ratio is exactly 1
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if config.gradient_checkpointing:
        checkpointing.enable(model)


def finish_training(model, config: GRPOConfig) -> None:
    if config.gradient_checkpointing:
        checkpointing.disable(model)
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
            val = f"{fmt(m.get('clip_low'))} / {fmt(m.get('clip_high'))}"
        elif label.startswith("reward"):
            val = f"{fmt(m.get('reward_mean'))} / {fmt(m.get('reward_std'))}"
        else:
            val = f"{m['n_trajectories']} / {m['trained_tokens']}"
        t.add_row(label, val)
    if m.get("credit") == "turn":
        t.add_row("credit", f"per turn (turn_advantages) on {m.get('turn_credit_rows')} trajectories")
    if m.get("skipped"):
        t.add_row("[red]skipped[/]", "non-finite gradient norm: weights unchanged")
    context.console.print(t)
