"""How much memory a training stage will need, and the refusal of one that cannot fit the machine.

A run that does not fit is killed by the kernel in the middle of its first long batch, an hour in for the longer
presets, with nothing on the screen but "Killed". So `sft` (and run-all's SFT and tunes, which call it) estimates
its peak from the model's shape and the batch settings before the first step and stops with one line saying what it
needs, what the machine has available, and which settings lower it; `grpo-step` does the same for its largest
micro-batch (plus a reference model's weights when the KL term needs one). A run on a CUDA device is not checked:
its activations live in the device's memory, which this arithmetic does not model. In a container, a Slurm job or
any cgroup with a memory limit, what is available is counted within that limit (atomcli.sysmem).

The estimate is arithmetic, not a measurement:

- the model's state: fp32 weights, their gradients and AdamW's two moments, 16 bytes a parameter (a LoRA run keeps
  gradients and moments for the adapter only);
- activations kept for the backward pass, per token and layer, a fixed number of hidden-size and intermediate-size
  vectors (`ACT_HIDDEN`, `ACT_INTERMEDIATE`) of `ACT_BYTES[precision]` bytes an element (bf16 autocast keeps the
  matmuls' outputs in 2 bytes but norms, softmax and the residual stream in 4), times the tokens of one micro-batch
  (`batch_size x max_length`); with gradient checkpointing a share of that (`CHECKPOINTED_SHARE`): in theory only
  each layer's input is kept, but the measured peak of the demo SFT fell by a third, not by nine tenths, so the
  estimate does not count on more;
- a margin (`MARGIN`) for the allocator's holes, the fused LM head's chunks and the interpreter.

The constants were fitted so that the estimate lies above the peaks that bench/bench_sft_memory.py measured for the
demo preset's SFT (fp32) and the real preset's (bf16); the point is to refuse what cannot fit, not to predict the
peak to the megabyte.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli import heap
from atomcli.errors import InputError

GB = 2**30
STATE_BYTES_PER_PARAM = 16   # fp32 weights + gradients + AdamW's exp_avg and exp_avg_sq
ACT_HIDDEN = 16              # hidden-size vectors kept per token and layer (norms, q/k/v, attention out, residuals)
ACT_INTERMEDIATE = 5         # intermediate-size vectors per token and layer (gate, up, activation, product)
ACT_BYTES = {"fp32": 4.0, "bf16": 3.0}  # bytes an activation element, by precision (resolved: not "auto")
CHECKPOINTED_SHARE = 0.75    # of the activations, with gradient checkpointing (measured: about 0.67)
# grpo-step's own forward (no TRL, its chunked LM head, the kept heap released before it) keeps far less with
# checkpointing: the demo's update, 4 rows padded to 1,072 tokens, took the run-all process from 3.3 to 4.5 GB, where
# the SFT share would predict 11.9 GB and refuse it on a 16 GB laptop.
GRPO_CHECKPOINTED_SHARE = 0.25
MARGIN = 1.25                # heap holes between batches of other lengths, fused-head chunks, the interpreter
BASE_BYTES = 1 * GB          # Python, torch and the tokenizer before any tensor
SKIP_ENV = "ATOM_MEMORY_CHECK"  # "0" turns the check off (a machine whose swap the user wants to use)
CAP_ENV = "ATOM_MEMORY_GB"      # check against at most this many GB: will this config fit a 16 GB laptop?


@dataclass(frozen=True)
class Shape:
    """What the estimate needs to know of a causal LM."""
    params: int
    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, model) -> "Shape":
        c = model.config
        c = getattr(c, "text_config", None) or c
        return cls(params=sum(p.numel() for p in model.parameters()), layers=int(c.num_hidden_layers),
                   hidden=int(c.hidden_size), intermediate=int(getattr(c, "intermediate_size", 4 * c.hidden_size)))


def training_bytes(shape: Shape, *, batch_rows: int, tokens_per_row: int, checkpointing: bool,
                   trainable_params: int | None = None, checkpointed_share: float = CHECKPOINTED_SHARE,
                   precision: str = "fp32") -> int:
    """The estimated peak resident bytes of training `shape` on micro-batches of `batch_rows` x `tokens_per_row`
    in `precision` (fp32 or bf16)."""
    trainable = shape.params if trainable_params is None else trainable_params
    state = 4 * shape.params + (STATE_BYTES_PER_PARAM - 4) * trainable
    tokens = batch_rows * tokens_per_row
    per_layer = tokens * (ACT_HIDDEN * shape.hidden + ACT_INTERMEDIATE * shape.intermediate) * ACT_BYTES[precision]
    act = shape.layers * per_layer * (checkpointed_share if checkpointing else 1.0)
    return int(BASE_BYTES + MARGIN * (state + act))


def available_bytes() -> int | None:
    """MemAvailable (what can be used without swapping, within the process's cgroup limit), or None where it is not
    known."""
    from atomcli.sysmem import meminfo
    return meminfo().get("MemAvailable")


def _cap() -> int | None:
    import os
    raw = os.environ.get(CAP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise InputError(f"{CAP_ENV}={raw!r} is not a number of gigabytes", hint="e.g. ATOM_MEMORY_GB=16")
    return int(value * GB)


def check_training(stage: str, model, *, batch_rows: int, tokens_per_row: int, checkpointing: bool,
                   trainable_params: int | None = None, checkpointed_share: float = CHECKPOINTED_SHARE,
                   extra_bytes: int = 0, precision: str = "fp32", hint: str) -> str | None:
    """`check_fits` for training `model` on the CPU in `precision` (resolved; a CUDA run is not checked: see the
    module docstring); returns its warning, if any, for the stage's log."""
    import torch
    if torch.cuda.is_available():
        return None
    need = training_bytes(Shape.of(model), batch_rows=batch_rows, tokens_per_row=tokens_per_row,
                          checkpointing=checkpointing, trainable_params=trainable_params,
                          checkpointed_share=checkpointed_share, precision=precision) + extra_bytes
    warning = check_fits(stage, need, hint)
    heap.set_ceiling(need)  # the kept heap stays within what this check said the stage needs (atomcli/heap.py)
    return warning


def usable_bytes() -> int | None:
    """What a training stage of this process can reach: MemAvailable plus what the process already holds (the
    model, run-all's earlier stages), since the estimate is of the whole process's peak; None where not known."""
    free = available_bytes()
    return None if free is None else free + int((heap.resident_mb() or 0) * 2**20)


def check_fits(stage: str, need: int, hint: str, *, available: int | None = None) -> str | None:
    """Refuse (InputError, exit 2) when `need` bytes exceed the memory usable now (`usable_bytes`, at most
    ATOM_MEMORY_GB); quiet where neither is known. A stage that fits but whose peak would leave less free than the
    kept heap's reserve gets a warning (returned): the heap guard would then hand the heap back at about every step,
    and each step would fault its pages in again, slower than a smaller micro-batch."""
    import os

    from atomcli import sysmem
    if os.environ.get(SKIP_ENV, "") == "0":
        return None
    have = usable_bytes() if available is None else available
    cap = _cap()
    capped = cap is not None and (have is None or cap < have)
    if capped:
        have = cap
    if have is None:
        return None
    if need <= have:
        total = cap if capped else sysmem.meminfo().get("MemTotal")
        keep = heap.guard.share * total if heap.guard is not None and total else 0
        if have - need >= keep:
            return None
        return (f"{stage}'s estimated peak of {need / GB:.1f} GB leaves {(have - need) / GB:.1f} GB free, under the "
                f"kept heap's reserve of {keep / GB:.1f} GB: the heap will be handed back at about every step, "
                f"which slows each step; to avoid that, {hint}")
    where = f"as {CAP_ENV} asks" if capped else sysmem.describe()  # read only for the refusal
    digits = 1
    while digits < 3 and f"{need / GB:.{digits}f}" == f"{have / GB:.{digits}f}":  # never "needs 13.2 ... 13.2 is"
        digits += 1
    raise InputError(f"{stage} needs about {need / GB:.{digits}f} GB of memory and {have / GB:.{digits}f} GB is "
                     f"available ({where})", hint=f"{hint}; or set {SKIP_ENV}=0 to try anyway")
