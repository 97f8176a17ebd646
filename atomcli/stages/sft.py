"""Stage `sft`: supervised fine-tuning on atomic-thought trajectories through TRL.

Only what the assistant generated is trained on; system, user and tool turns and the chat
template's glue are context. Each row becomes `input_ids` + `completion_mask`, which TRL's
`SFTTrainer(completion_only_loss=True)` turns into labels for any chat template (its
`assistant_only_loss` refuses templates without generation markers, SmolLM2's among them):

- rows with token columns made by this model's tokenizer use them as sampled:
  `prompt_ids + completion_ids` with mask `[0]*len(prompt_ids) + loss_mask`;
- otherwise (and for a row whose token columns are all null) `messages` are rendered with the
  tokenizer's chat template one message at a time; for an assistant message the text after the
  generation prompt, up to the end-of-turn token, is marked (the newline the template adds after
  it is glue).

Rejection sampling is `atom rft` (it keeps the right answers) before this stage. `--lora` trains a peft
adapter and merges it before saving, so the output is a plain checkpoint like any other.
TRL runs in a temporary output folder; its prints go to stderr (stdout carries data only).
Progress is atomcli.progress's (step/max_steps, ETA, the last loss), reported by a TRL
TrainerCallback (`ProgressReport`) in place of the Trainer's printer of raw log dicts.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import ClassVar

from atomcli.config import Removed, opt
from atomcli.errors import InputError, unknown_choice


# --sampling: ours -> transformers' train_sampling_strategy (its LengthGroupedSampler for "length")
SAMPLING = {"random": "random", "length": "group_by_length"}


@dataclass
class SFTConfig:
    model: str = opt("smollm2", "base model: `smollm2`, a checkpoint folder or hub id")
    epochs: float = opt(1.0, "passes over the data")
    max_steps: int = opt(0, "stop after this many optimizer steps (0 = run all epochs)")
    lr: float = opt(5e-5, "learning rate")
    lr_scheduler: str = opt("linear", "learning-rate schedule (transformers names: linear, cosine, constant...)",
                            advanced=True)
    warmup_ratio: float = opt(0.0, "fraction of the steps spent warming the learning rate up", advanced=True)
    batch_size: int = opt(4, "sequences per device batch")
    grad_accum: int = opt(1, "gradient accumulation steps", advanced=True)
    max_length: int = opt(2048, "truncate sequences to this many tokens")
    pad_multiple: int = opt(256, "pad each batch to a multiple of this many tokens (0: to its longest row): a few "
                                 "tensor sizes, whose freed blocks the kept heap can reuse as they are "
                                 "(atomcli/heap.py)", advanced=True)
    gradient_checkpointing: bool = opt(True, "recompute activations in the backward pass (less memory, more time)",
                                       advanced=True)
    precision: str = opt("auto", "mixed precision: bf16 or fp32 (auto: bf16 on a GPU that supports it, else fp32); "
                                 "bf16 autocasts the matmuls and keeps fp32 master weights, and on a CPU with "
                                 "AMX it is much faster (bench/RESULTS.md)", advanced=True)
    sampling: str = opt("random", "batch order: random, or length (rows of similar length batched together within "
                                  "random quarters of the set, at most 50 batches each, longest first: less "
                                  "padding; every row once an epoch, but max_steps short of an epoch skips "
                                  "the shortest rows of the last quarter it reaches)", advanced=True)
    lora: bool = opt(False, "train a LoRA adapter (peft) and merge it into the saved checkpoint")
    lora_r: int = opt(16, "LoRA rank", advanced=True)
    seed: int = opt(0, "random seed")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run", advanced=True)

    # sft filtered rows by reward itself; `atom rft` selects the rows to train on
    REMOVED: ClassVar[dict] = {"min_reward": Removed(
        "select the rows first: `atom rft` keeps the answers with F1 >= --min-f1", takes_value=True)}


def run(table, config: SFTConfig, context):
    """Fine-tune on `table`; returns a checkpoint.TrainResult (cli saves it)."""
    import torch

    from atomcli import checkpoint, models

    _check_config(config)
    if not checkpoint.is_main_process():  # under torchrun / accelerate launch: one voice per job
        context.quiet = True
    model, tok = models.load(config.model, context, trust_remote_code=config.trust_remote_code)
    examples, how = build_examples(table, tok)
    if warning := _check_memory(model, examples, config):
        context.log(f"[yellow]note:[/] {warning}")
    n_tokens = sum(sum(m) for m in examples["completion_mask"])
    if n_tokens == 0:
        raise InputError("no assistant tokens to train on", column="messages",
                         hint="rows need assistant messages (or loss_mask = 1 tokens)")
    context.log(f"sft: {len(examples['input_ids'])} rows ({how}), {n_tokens} trained tokens")

    from atomcli.progress import Progress
    from atomcli.train import labelled_head
    trainer, out_dir = _trainer(model, tok, examples, config)
    t0 = time.perf_counter()
    try:
        with labelled_head.labelled_positions_only(), contextlib.redirect_stdout(sys.stderr), \
                Progress(context, "sft", None, "steps") as progress:
            trainer.add_callback(progress_callback(progress))  # stdout is data: anything TRL prints goes to stderr
            trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    seconds = time.perf_counter() - t0
    model = trainer.model
    if config.lora:
        model = model.merge_and_unload()
    model.config.use_cache = True  # the trainer turns the KV cache off for checkpointing; generation wants it
    model.eval()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    steps = trainer.state.global_step
    metrics = {"train_loss_first": losses[0] if losses else None, "train_loss_last": losses[-1] if losses else None,
               "train_losses": losses, "steps": steps, "seconds": seconds,
               "seconds_per_step": seconds / steps if steps else None, "rows": len(examples["input_ids"]),
               "trained_tokens": n_tokens, "source": how}
    if torch.cuda.is_available():
        metrics["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    context.log(f"sft: {steps} steps in {seconds:.1f} s, loss {_fmt(metrics['train_loss_first'])} -> "
                f"{_fmt(metrics['train_loss_last'])}")
    return checkpoint.TrainResult(model=model, tokenizer=tok, step=0, metrics=metrics,
                                  base=checkpoint.spec_id(config.model))


def _check_memory(model, examples: dict, config: SFTConfig) -> str | None:
    """Stop before the first step when the largest micro-batch cannot fit the memory available (train/memory.py);
    the check's warning when it fits only tightly."""
    from atomcli.train import accel, memory
    longest = min(config.max_length, max((len(ids) for ids in examples["input_ids"]), default=0))
    if config.pad_multiple > 0:
        longest = -(-longest // config.pad_multiple) * config.pad_multiple
    return memory.check_training("sft", model, batch_rows=config.batch_size, tokens_per_row=longest,
                                 checkpointing=config.gradient_checkpointing,
                                 trainable_params=0 if config.lora else None,
                                 precision=accel.resolve_precision(config.precision),
                                 hint="lower --batch-size (raise --grad-accum for the same update), turn on "
                                      "--gradient-checkpointing, or lower --max-length")


def _fmt(x):
    return "-" if x is None else f"{x:.4f}"


def progress_callback(progress):
    """A TRL/transformers TrainerCallback that reports step/max_steps and the last loss to `progress`."""
    from transformers import TrainerCallback

    class ProgressReport(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            progress.update(completed=state.global_step, total=state.max_steps)

        def on_step_end(self, args, state, control, **kwargs):
            progress.update(completed=state.global_step, total=state.max_steps)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                lr = logs.get("learning_rate")
                progress.update(info=f"loss {logs['loss']:.4f}" + (f"  lr {lr:.3g}" if lr is not None else ""))

    return ProgressReport()


def _check_config(config: SFTConfig) -> None:
    for name in ("batch_size", "grad_accum", "max_length", "lora_r"):
        if getattr(config, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    if not config.lr > 0 or not config.epochs > 0:
        raise InputError("--lr and --epochs must be > 0")
    if not 0 <= config.warmup_ratio < 1:
        raise InputError("--warmup-ratio must be in [0, 1)")
    if config.pad_multiple < 0:
        raise InputError("--pad-multiple must be 0 (pad to the longest row) or a positive number of tokens")
    if config.sampling not in SAMPLING:
        raise unknown_choice("sampling", config.sampling, SAMPLING)
    from atomcli.train.accel import check_precision
    check_precision(config.precision)


# --- examples -------------------------------------------------------------------------------------

def build_examples(table, tok) -> tuple[dict, str]:
    """{"input_ids", "completion_mask"} per row, and which source the tokens came from.

    A table with this tokenizer's token columns may also hold rows whose three token columns are all null
    (run-all's rejection-sampling rounds mix the expert's rows, which have only `messages`, into the policy's
    own): those rows are rendered with the chat template."""
    from atomcli import models, schema
    names = ("prompt_ids", "completion_ids", "loss_mask")
    rec = schema.token_source(table) if all(c in table.column_names for c in names) else None
    if rec is None or rec.get("tokenizer") != models.tokenizer_id(tok):
        tokens = [(None, None, None)] * table.num_rows
    else:
        tokens = list(zip(*(table.column(c).to_pylist() for c in names)))
    messages = table.column("messages")  # read a row at a time: only rendered rows need theirs
    ids, cm, rendered = [], [], 0
    for i, row in enumerate(tokens):
        if any(x is not None for x in row):
            p, c, m = row
            if None in row:
                raise InputError(f"a row has {names[row.index(None)]} null but other token columns set", row=i,
                                 column=names[row.index(None)], hint="a row has all three token columns or none")
            if len(c) != len(m):
                raise InputError("token columns are misaligned", row=i, column="loss_mask",
                                 hint="loss_mask must have one entry per completion token")
            ids.append(list(p) + list(c))
            # where SFT masks: prompt, tool responses and glue are 0 (context); what the policy wrote is 1
            cm.append([0] * len(p) + [int(x) for x in m])
            continue
        try:
            a, b = render_masked(messages[i].as_py() or [], tok)
        except InputError as e:
            raise e.located(row=i) from None
        ids.append(a)
        cm.append(b)
        rendered += 1
    how = ("chat template" if rendered == len(ids) else "token columns" if not rendered
           else f"token columns, {rendered} row{'s' * (rendered > 1)} by chat template")
    return {"input_ids": ids, "completion_mask": cm}, how


def render_masked(messages: list[dict], tok) -> tuple[list[int], list[int]]:
    """Token ids of the chat rendering and a mask that is 1 exactly on assistant-generated tokens."""
    msgs = [{"role": m.get("role") or "", "content": m.get("content") or ""} for m in messages]
    segments: list[tuple[str, int]] = []
    prev = ""
    for k, m in enumerate(msgs):
        full = _render(tok, msgs[:k + 1], False)
        if m["role"] == "assistant":
            head = _render(tok, msgs[:k], True)
            if not (head.startswith(prev) and full.startswith(head)):
                raise _not_incremental()
            body = full[len(head):]
            generated = body.rstrip()  # content + end-of-turn token; the trailing newline is template glue
            segments += [(head[len(prev):], 0), (generated, 1), (body[len(generated):], 0)]
        else:
            if not full.startswith(prev):
                raise _not_incremental()
            segments.append((full[len(prev):], 0))
        prev = full
    ids, mask = [], []
    for text, trained in segments:
        if text:
            piece = tok(text, add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [trained] * len(piece)
    return ids, mask


def _render(tok, msgs: list[dict], generation_prompt: bool) -> str:
    if not msgs:
        return ""
    try:
        return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as e:  # template errors (unknown roles, missing template) are input problems
        raise InputError(f"the chat template cannot render these messages ({str(e).splitlines()[0][:120]})",
                         column="messages", hint="roles must be system, user, assistant or tool") from None


def _not_incremental() -> InputError:
    return InputError("the chat template rewrites earlier turns, so assistant tokens cannot be located",
                      column="messages", hint="provide token columns (prompt_ids, completion_ids, loss_mask) "
                      "made with this model's tokenizer")


# --- TRL ------------------------------------------------------------------------------------------

def _trainer(model, tok, examples: dict, config: SFTConfig):
    import torch
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    from atomcli.train import accel, checkpointing

    out_dir = tempfile.mkdtemp(prefix="atom-sft-")
    args = TRLSFTConfig(
        output_dir=out_dir, completion_only_loss=True, use_cpu=not torch.cuda.is_available(),
        bf16=accel.resolve_precision(config.precision) == "bf16",
        fp16=False, per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.grad_accum,
        num_train_epochs=config.epochs, max_steps=config.max_steps or -1, learning_rate=config.lr,
        lr_scheduler_type=config.lr_scheduler, warmup_steps=config.warmup_ratio,  # a float < 1 is a ratio
        seed=config.seed, train_sampling_strategy=SAMPLING[config.sampling],
        max_length=config.max_length, pad_to_multiple_of=config.pad_multiple or None,
        **{checkpointing.trainer_arg(TRLSFTConfig): config.gradient_checkpointing},
        report_to="none", disable_tqdm=True, logging_steps=1, save_strategy="no", dataloader_num_workers=0,
    )
    peft_config = None
    if config.lora:
        from peft import LoraConfig
        peft_config = LoraConfig(r=config.lora_r, lora_alpha=2 * config.lora_r, lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict(examples), processing_class=tok,
                         peft_config=peft_config)
    from transformers.trainer_callback import PrinterCallback
    trainer.remove_callback(PrinterCallback)  # raw per-step dicts; progress_callback reports instead
    return trainer, out_dir
