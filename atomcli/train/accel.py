"""The GRPO update's bridge to `accelerate`: one Accelerator, one prepared module, full-state saving.

`grpo-step` prepares its model and AdamW with `accelerate.Accelerator`, so `accelerate launch`
with the user's config runs single-process, DDP, FSDP (FSDP2) or DeepSpeed without code of
its own for collectives. What this module adds around accelerate:

- `make_accelerator`: `--precision auto|bf16|fp32` (auto = bf16 on a GPU that has it, else
  fp32) becomes `mixed_precision`. On a machine without CUDA it passes `cpu=True`: accelerate
  1.15 otherwise sees torchrun's LOCAL_RANK, finds no GPU and silently runs every rank as a
  lone process. DDP's buffer broadcast is off (the only buffers are RoPE tables, the same on
  every rank), so no-grad forward passes hold no collectives.
- `policy_scorer`: the model is wrapped in a module whose forward returns the per-token
  log-probs (atomcli.train.logprobs), and that wrapper is what accelerate prepares, so every
  forward, the chunked LM head included, runs inside DDP's / FSDP's forward hooks.
- `pad_micro_batches`: every rank runs the same number of forward/backward passes (ranks
  whose share is smaller, e.g. because their zero-advantage rows were skipped, add passes
  of a weight-0 dummy micro-batch): FSDP all-gathers in every forward and DeepSpeed ZeRO-2/3
  reduces in every backward, so unequal counts would deadlock.
- `full_state_dict` / `full_optimizer_state` / `load_optimizer_state`: the weights come from
  `accelerator.get_state_dict` (gathered on rank 0) and the AdamW state is gathered into the
  plain `optimizer.state_dict()` layout (integer parameter ids in `parameters()` order), so
  `optimizer.pt` is the same file whatever the launch and a checkpoint written by 8 FSDP
  ranks resumes in one process or under DDP and the other way round; loading re-shards it.
  The whole state passes through rank 0's CPU memory (accelerate's FULL_STATE_DICT way;
  SHARDED_STATE_DICT is not used).
- `register_teardown`: at exit every rank meets at a barrier, then the process group is
  destroyed (accelerator.end_training), so no rank's gloo/NCCL threads are torn down while
  a peer still talks to it ("terminate called without an active exception").

What runs where. CPU (gloo): one process and DDP. FSDP: accelerate 1.15 turns FSDP on only for
GPU-type launches (AcceleratorState enables it for MULTI_GPU/XPU/NPU/... but not MULTI_CPU),
so `accelerate launch --use_fsdp` on a CPU machine runs DDP (grpo-step says so); torch's
FSDP2 itself runs on CPU with gloo, and the tests check this module's FSDP2 path there by
setting accelerate's state to FSDP by hand (tests/test_grpo_accelerate.py). DeepSpeed is not
installed here and needs GPUs: its path (accelerate's engine backward/step, clipping inside
the engine) is written to accelerate's contract but untested, and its optimizer state is not
saved (ZeRO partitions it; AdamW restarts each call, with a note). LoRA under FSDP is refused
(the adapter and merged weights would need their own gathering): use DDP for adapters.
"""

from __future__ import annotations

import atexit
import datetime
import os

from atomcli.errors import InputError

PRECISIONS = ("auto", "bf16", "fp32")
_TEARDOWN = {"registered": False}


def check_precision(precision: str) -> None:
    """The `--precision` flag of sft and grpo-step: one of PRECISIONS (a usage error otherwise)."""
    if precision not in PRECISIONS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("--precision", precision, PRECISIONS)


def resolve_precision(precision: str) -> str:
    """`auto` -> bf16 on a CUDA GPU that supports it, else fp32."""
    check_precision(precision)
    if precision != "auto":
        return precision
    import torch
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def autocast(model, precision: str):
    """A context that runs `model`'s forward passes in bf16 autocast when `precision` (resolved) is bf16."""
    import contextlib

    import torch
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)


def make_accelerator(precision: str = "auto"):
    """The process's Accelerator for one GRPO update (single process or whatever the launcher set up)."""
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    mixed = {"bf16": "bf16", "fp32": "no"}[resolve_precision(precision)]
    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision") != mixed:
        # an earlier stage of this process (sft's trainer, a grpo-step at another precision) fixed the
        # state; keep the process group (PartialState), start the rest afresh
        AcceleratorState._reset_state(reset_partial_state=False)
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=mixed,
                              kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False),
                                               # the other ranks wait at the exit barrier while rank 0
                                               # writes the checkpoint (tens of GB at 7B): not 10 minutes
                                               InitProcessGroupKwargs(timeout=datetime.timedelta(hours=2))])
    accelerator.gradient_accumulation_steps = 1
    if accelerator.num_processes > 1:
        register_teardown(accelerator)
    return accelerator


def requested_but_not_run(accelerator) -> str | None:
    """A sentence when the launch asked for FSDP/DeepSpeed but accelerate runs something else."""
    from accelerate.utils import DistributedType
    kind = accelerator.distributed_type
    for env, want in (("ACCELERATE_USE_FSDP", DistributedType.FSDP), ("ACCELERATE_USE_DEEPSPEED",
                                                                      DistributedType.DEEPSPEED)):
        if os.environ.get(env, "false").lower() == "true" and kind != want:
            return (f"the launch asked for {want.value} but accelerate runs {kind.value} here "
                    "(accelerate enables FSDP/DeepSpeed only on GPU launches)")
    return None


def register_teardown(accelerator) -> None:
    """At exit: all ranks meet, then the process group goes (once per process)."""
    if _TEARDOWN["registered"]:
        return
    _TEARDOWN["registered"] = True

    def teardown():
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return
        try:
            # rank 0 writes the checkpoint after the update; the others wait here instead of exiting
            # while their connections to it are still open
            dist.barrier()
        finally:
            accelerator.end_training()  # destroys the process group

    atexit.register(teardown)


# --- the prepared module ---------------------------------------------------------------------------

_SCORER = None


def policy_scorer(policy):
    """`policy` wrapped as a module whose forward returns (log-probs, entropies) of the scored tokens."""
    global _SCORER
    if _SCORER is None:
        import torch

        from atomcli.train.logprobs import causal_lm, sequence_logprobs

        class PolicyScorer(torch.nn.Module):
            """What accelerate prepares: DDP/FSDP hooks run around the whole log-prob computation."""

            def __init__(self, policy):
                super().__init__()
                self.policy = policy
                lm = causal_lm(policy)
                # FSDP2's auto-wrap reads the transformer block classes from the root module
                self._no_split_modules = lm._no_split_modules

            def get_input_embeddings(self):
                return self.policy.get_input_embeddings()

            def get_output_embeddings(self):
                return self.policy.get_output_embeddings()

            def forward(self, input_ids, attention_mask, rows, cols, targets, temperature: float = 1.0):
                return sequence_logprobs(self.policy, input_ids, attention_mask, rows, cols, targets, temperature)

        _SCORER = PolicyScorer
    return _SCORER(policy)


# --- equal pass counts ---------------------------------------------------------------------------

def all_sum(accelerator, tensor):
    """Sum over ranks (NCCL reduces only device tensors); identity in one process."""
    if accelerator is None or accelerator.num_processes == 1:
        return tensor
    return accelerator.reduce(tensor.to(accelerator.device), reduction="sum").to(tensor.device)


def pad_micro_batches(accelerator, mbs: list, device, pad_id: int = 0) -> list:
    """`mbs` plus weight-0 dummies, up to the largest micro-batch count of any rank."""
    import torch
    if accelerator is None or accelerator.num_processes == 1:
        return mbs
    most = int(accelerator.reduce(torch.tensor([len(mbs)], device=accelerator.device), reduction="max").item())
    return mbs + [dummy_micro_batch(device, pad_id) for _ in range(most - len(mbs))]


def dummy_micro_batch(device, pad_id: int = 0):
    """Two pad tokens, one target, loss mask 0 and weight 0: a pass that adds exactly 0 to every gradient."""
    import torch

    from atomcli.train.microbatch import MicroBatch
    long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    zero = torch.zeros(1, dtype=torch.float32, device=device)
    return MicroBatch(long([[pad_id, pad_id]]), long([[1, 1]]), long([0]), long([0]), long([pad_id]),
                      zero, zero.clone(), zero.clone(), zero.clone(), 0)


def loss_scale(accelerator) -> float:
    """The factor that undoes the launch's gradient averaging and accelerate's accumulation division.

    The micro-batch losses already carry the *global* weights (1 / all sampled tokens), so the
    gradient wanted is the sum over ranks and passes; DDP, FSDP and DeepSpeed average over ranks,
    accelerate's backward divides by the accumulation steps (DeepSpeed's engine by its own)."""
    from accelerate.utils import DistributedType
    if accelerator is None:
        return 1.0
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        steps = accelerator.deepspeed_engine_wrapped.engine.gradient_accumulation_steps()
    else:
        steps = accelerator.gradient_accumulation_steps
    return float(accelerator.num_processes * steps)


# --- full state on rank 0 ------------------------------------------------------------------------

def is_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType
    return accelerator is not None and accelerator.distributed_type == DistributedType.DEEPSPEED


def is_sharded(accelerator) -> bool:
    from accelerate.utils import DistributedType
    return accelerator is not None and accelerator.distributed_type in (DistributedType.FSDP,
                                                                        DistributedType.DEEPSPEED)


def full_state_dict(accelerator, scorer) -> dict | None:
    """The policy's full weights (rank 0; {} elsewhere) when they are sharded; None when the live
    module already holds them (one process, DDP): save_pretrained then reads the model itself.
    Every rank must call this (it gathers)."""
    if not is_sharded(accelerator):
        return None
    from torch.distributed.tensor import DTensor
    sd = accelerator.get_state_dict(scorer)
    out = {}
    for name, value in sd.items():  # a collective per DTensor left sharded: same order on every rank
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if accelerator.is_main_process:
            out[name.removeprefix("policy.")] = value.detach().cpu()
    return out


def _inner(optimizer):
    from accelerate.optimizer import AcceleratedOptimizer
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def full_optimizer_state(accelerator, optimizer) -> dict | None:
    """AdamW's state dict with every sharded tensor gathered; rank 0 keeps it, the other ranks get
    None (a CPU copy per rank would be the whole state times the ranks in host memory). Every rank
    calls this: gathering a DTensor is a collective."""
    if is_deepspeed(accelerator):
        return None  # ZeRO partitions it inside the engine; see the module docstring
    import torch
    from torch.distributed.tensor import DTensor
    main = accelerator is None or accelerator.is_main_process
    sd = _inner(optimizer).state_dict()
    for pid in sorted(sd["state"]):
        for key, value in list(sd["state"][pid].items()):
            if isinstance(value, DTensor):
                value = value.full_tensor()
            if main and isinstance(value, torch.Tensor):
                sd["state"][pid][key] = value.detach().cpu()
    return sd if main else None


def load_optimizer_state(accelerator, optimizer, state: dict | None, source: str = "-") -> None:
    """Continue a saved AdamW run: the full state, re-sharded like the parameters it belongs to."""
    if state is None or is_deepspeed(accelerator):
        return
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    inner = _inner(optimizer)
    params = [p for g in inner.param_groups for p in g["params"]]
    state = {"state": dict(state.get("state", {})), "param_groups": state.get("param_groups", [])}
    try:
        for pid, entry in list(state["state"].items()):
            p = params[int(pid)]
            if isinstance(p, DTensor):  # an FSDP2 parameter: the moments get its placement
                entry = {k: distribute_tensor(v.to(p.device, p.dtype), p.device_mesh, p.placements)
                         if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(p.shape) else v
                         for k, v in entry.items()}
            state["state"][pid] = entry
        lr_decay = [(g["lr"], g["weight_decay"]) for g in inner.param_groups]
        inner.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError, IndexError) as e:
        raise InputError(f"optimizer.pt does not match the model ({str(e).splitlines()[0][:120]})", file=source,
                         hint="was it written with a different --lora setting or model?") from None
    for g, (lr, decay) in zip(inner.param_groups, lr_decay):  # the saved state keeps its moments; flags set the rest
        g["lr"], g["weight_decay"] = lr, decay
