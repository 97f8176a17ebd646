"""Memory on paper: bytes per GPU to train a Qwen2.5-shaped policy with `grpo-step`.

The arithmetic behind docs/scale.md, which this module generates (the block between the
`scale.py` markers) and checks:

    python -m atomcli.scale            # print the generated tables (Markdown)
    python -m atomcli.scale --write    # rewrite the generated block of docs/scale.md
    python -m atomcli.scale --check    # exit 1 when docs/scale.md differs from this module

Parameters (Qwen2 architecture: q/k/v projections with bias, o/MLP without, two RMSNorms
per layer, a final norm, an input embedding and an LM head that may be tied to it):

    layer  = h(h + 2·kv) + (h + 2·kv)  +  h·h  +  3·h·I  +  2h        kv = kv_heads · h/heads
    N      = L·layer + V·h·(1 if tied else 2) + h
    LoRA r = L · r · (9h + 2·kv + 3I)        (q, k, v, o, gate, up, down: r·(in + out) each)

Training state per GPU, for N trainable parameters (`Precision` below):

    weights w·N, gradients g·N, AdamW moments 2·m·N plus a master copy a·N, plus 4 bytes of
    `step` per parameter tensor (torch keeps it as a float32 scalar).

Activations (what autograd keeps for the backward pass, bytes per token per layer, element
size e of the compute dtype; counted from HF's Qwen2 layer with SDPA attention and checked
against saved-tensor hooks in tests/test_scale.py):

    A_layer = 2·(4h + r·h)                 two RMSNorms: their fp32 input and the normalized tensor (dtype r)
            + c·e·h + e·h + 2·e·kv'        projection inputs (c of them), q, k and v
            + 4·e·I                        SwiGLU: gate, SiLU, up, their product
            + e·s   (padded rows only)     the boolean mask SDPA turns into a float (s keys) mask, per layer
            + 4·heads + 8                  fp32 log-sum-exp per head and the two norms' rsqrt
    kv' = kv, or h when the micro-batch is padded: HF then repeats k/v to every head before SDPA.

In one dtype (r = e) the three projection groups share their inputs (c = 3). Under autocast
(fp32 weights, `accelerate` mixed_precision=bf16, grpo-step's `--precision bf16`) the residual
stream stays fp32 (r = 4) and every projection saves its own bf16 cast of its input (c = 6);
the bf16 casts of the weight matrices are saved too (e per matrix parameter, every layer
without checkpointing, one layer with it) and the LM head's weight is cast once per forward.

For T = micro_batch · s tokens: without checkpointing T·(L + 1)·A_layer (every layer, plus one
layer's gradients in flight); with gradient checkpointing (grpo-step's default) T·L·r·h (each
layer's input) + 2·T·A_layer (one layer recomputed, and its gradients). Both add T·(4 + 2r)·h
(final norm, gathered hidden states) and, when padded, the b·s² boolean mask. The LM head never
materializes the logits (`atomcli/train/logprobs.py`): two fp32 chunks of CHUNK_ELEMENTS.

The optimizer step itself needs no activations but torch's foreach AdamW allocates one more
moment-sized buffer (sqrt of the second moment), so the peak is

    weights + gradients + optimizer + max(activations + transients, AdamW step buffer).

Transients by setup: PyTorch DDP's reducer keeps its gradient buckets beside the gradients
(one more gradient-sized copy, accelerate's default `gradient_as_bucket_view=False`);
FSDP/ZeRO-3 gathers the unsharded parameters (and then gradients) of the root unit (embedding,
head) and of two decoder layers (the current one and the prefetched next) in the compute dtype.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

GIB = 2 ** 30
GPU_GIB = 80            # one A100/H100-80GB
USABLE = 0.9            # headroom for the CUDA context, allocator fragmentation and kernel workspaces
WORLD = 8               # GPUs in the multi-GPU setups
LORA_R = 16             # grpo-step's --lora-r default
SEQ = 8192              # tokens per trajectory in the headline table (prompt + completion)
MICRO_BATCH = 2         # examples/gpu-7b.toml's [grpo-step] micro_batch
STEP_BYTES = 4          # AdamW `step`: one float32 scalar tensor per parameter tensor
DOC = Path(__file__).resolve().parents[1] / "docs" / "scale.md"
BEGIN, END = "<!-- scale.py:begin (generated: python -m atomcli.scale --write) -->", "<!-- scale.py:end -->"


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's shape, as in its config.json."""
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    source: str = ""

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)


HF = "https://huggingface.co/"
# The published config.json values (read from copies of Qwen/Qwen2.5-*-Instruct's config.json; see docs/scale.md).
QWEN25 = {s.name: s for s in (
    Shape("0.5B", 896, 24, 14, 2, 4864, 151936, True, HF + "osllmai-community/Qwen2.5-0.5B/blob/main/config.json"),
    Shape("1.5B", 1536, 28, 12, 2, 8960, 151936, True,
          HF + "onnx-community/Qwen2.5-1.5B-Instruct/blob/94677ac90364afdc2b476788d085a9680efde737/config.json"),
    Shape("3B", 2048, 36, 16, 2, 11008, 151936, True,
          HF + "osllmai-community/Qwen2.5-3B-Instruct/blob/main/config.json"),
    Shape("7B", 3584, 28, 28, 4, 18944, 152064, False,
          HF + "osllmai-community/Qwen2.5-7B-Instruct/blob/main/config.json"),
    Shape("14B", 5120, 48, 40, 8, 13824, 152064, False,
          HF + "osllmai-community/Qwen2.5-14B-Instruct/blob/eaddfa685697f74aa707d6cd5cf36784cdcabe05/config.json"),
)}
TABLE_MODELS = ("0.5B", "1.5B", "3B", "7B", "14B")


def layer_params(s: Shape) -> int:
    h, kv, i = s.hidden, s.kv_dim, s.intermediate
    return h * (h + 2 * kv) + (h + 2 * kv) + h * h + 3 * h * i + 2 * h


def root_params(s: Shape) -> int:
    """Everything outside the decoder layers: embedding, LM head unless tied, final norm."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden


def param_count(s: Shape) -> int:
    return s.layers * layer_params(s) + root_params(s)


def param_tensors(s: Shape) -> int:
    """Parameter tensors: per layer q/k/v weight and bias, o, gate, up, down, two norms."""
    return 12 * s.layers + 2 + (0 if s.tied else 1)


def lora_param_count(s: Shape, r: int = LORA_R) -> int:
    """peft `target_modules="all-linear"` (what grpo-step --lora uses): every projection, not the LM head."""
    h, kv, i = s.hidden, s.kv_dim, s.intermediate
    return s.layers * r * (9 * h + 2 * kv + 3 * i)


def lora_tensors(s: Shape) -> int:
    return 7 * 2 * s.layers  # lora_A and lora_B of 7 projections


@dataclass(frozen=True)
class Precision:
    """Bytes per trainable parameter, and the element size of activations (the compute dtype)."""
    name: str
    weight: int
    grad: int
    moment: int          # per AdamW moment (two of them)
    master: int          # fp32 master copy kept by the optimizer wrapper (mixed precision)
    act: int
    autocast: bool       # fp32 weights under torch.autocast: fp32 residual stream, bf16 casts saved
    lora_base: int       # bytes per frozen base parameter under LoRA
    note: str


PRECISIONS = {p.name: p for p in (
    Precision("bf16-mixed", 2, 2, 4, 4, 2, False, 2,
              "bf16 weights and gradients, fp32 master copy and moments (the DeepSpeed/ZeRO accounting)"),
    Precision("bf16-autocast", 4, 4, 4, 0, 2, True, 4,
              "grpo-step --precision bf16 (the GPU default): fp32 weights, gradients and AdamW moments "
              "(`models.load` builds fp32), bf16 compute under accelerate's autocast; a LoRA base stays fp32"),
    Precision("fp32", 4, 4, 4, 0, 4, False, 4, "grpo-step --precision fp32 (the CPU default): everything fp32"),
    Precision("bf16-pure", 2, 2, 2, 0, 2, False, 2, "the model cast to bf16, AdamW moments in bf16 too"),
)}


def adamw_state_bytes(n_params: int, n_tensors: int, p: Precision) -> int:
    """Two moments, the master copy if any, and the per-tensor `step`."""
    return (2 * p.moment + p.master) * n_params + STEP_BYTES * n_tensors


def lm_head_chunk_bytes() -> int:
    from atomcli.train.logprobs import CHUNK_ELEMENTS
    return 2 * 4 * CHUNK_ELEMENTS["other"]  # two fp32 chunk buffers on a GPU


def matrix_params(s: Shape) -> int:
    """A layer's weight matrices (what autocast casts to bf16): everything but biases and norms."""
    return layer_params(s) - (s.hidden + 2 * s.kv_dim) - 2 * s.hidden


def layer_activation_bytes(s: Shape, e: int, seq: int, padded: bool, autocast: bool = False) -> int:
    """Bytes autograd keeps per token for one decoder layer (module docstring), weight casts excluded."""
    h = s.hidden
    kv = h if padded else s.kv_dim
    r, c = (4, 6) if autocast else (e, 3)
    return 2 * (4 * h + r * h) + c * e * h + e * h + 2 * e * kv + 4 * e * s.intermediate \
        + (e * seq if padded else 0) + 4 * s.heads + 8


def activation_bytes(s: Shape, e: int, seq: int, micro_batch: int, checkpointing: bool, padded: bool,
                     autocast: bool = False) -> int:
    """Peak activation bytes of one micro-batch's forward/backward (module docstring)."""
    t = seq * micro_batch
    r = 4 if autocast else e
    per_layer = layer_activation_bytes(s, e, seq, padded, autocast)
    casts = e * matrix_params(s) if autocast else 0  # per layer, saved for the backward pass
    if checkpointing:
        held = t * s.layers * r * s.hidden + 2 * t * per_layer + casts
    else:
        held = t * (s.layers + 1) * per_layer + s.layers * casts
    head_cast = e * s.vocab * s.hidden if autocast else 0
    return held + t * (4 + 2 * r) * s.hidden + (micro_batch * seq * seq if padded else 0) + lm_head_chunk_bytes() \
        + head_cast


def kv_cache_bytes_per_token(s: Shape, e: int = 2) -> int:
    """Rollout KV cache (atomcli's HF engine or vLLM): keys and values of every layer."""
    return 2 * s.layers * s.kv_dim * e


@dataclass(frozen=True)
class Setup:
    name: str
    shards: int          # weights/gradients/optimizer state divided over this many GPUs
    lora: bool = False
    ddp_buckets: bool = False


SETUPS = {u.name: u for u in (
    Setup("1 GPU", 1),
    Setup(f"DDP x{WORLD}", 1, ddp_buckets=True),
    Setup(f"FSDP x{WORLD}", WORLD),
    Setup("LoRA, 1 GPU", 1, lora=True),
)}


@dataclass(frozen=True)
class Budget:
    params: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    transient: int       # DDP buckets / FSDP gathers (live with the activations)
    step_buffer: int     # foreach AdamW's extra moment-sized buffer (after the activations are gone)

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + max(self.activations + self.transient,
                                                                self.step_buffer)


def budget(s: Shape, setup: Setup, p: Precision, *, seq: int = SEQ, micro_batch: int = MICRO_BATCH,
           checkpointing: bool = True, padded: bool = True, lora_r: int = LORA_R) -> Budget:
    """Bytes on one GPU for one grpo-step update (module docstring)."""
    n = param_count(s)
    act = activation_bytes(s, p.act, seq, micro_batch, checkpointing, padded, p.autocast)
    if setup.lora:
        # peft keeps adapters in fp32 over a bf16 base (autocast_adapter_dtype): fp32 weights, gradients, moments
        nl = lora_param_count(s, lora_r)
        fp32 = PRECISIONS["fp32"]
        return Budget(nl, p.lora_base * n + 4 * nl, 4 * nl, adamw_state_bytes(nl, lora_tensors(s), fp32), act, 0,
                      fp32.moment * nl)
    k = setup.shards
    weights = -(-p.weight * n // k)
    grads = -(-p.grad * n // k)
    optimizer = -(-adamw_state_bytes(n, param_tensors(s), p) // k)
    if k > 1:  # unsharded root unit and two layers, parameters and then gradients, in the compute dtype
        transient = 2 * p.act * (root_params(s) + 2 * layer_params(s))
    else:
        transient = p.grad * n if setup.ddp_buckets else 0
    return Budget(n, weights, grads, optimizer, act, transient, -(-p.moment * n // k))


def reference_pass_bytes(s: Shape, setup: Setup, p: Precision, *, seq: int = SEQ, micro_batch: int = MICRO_BATCH,
                         padded: bool = True) -> int:
    """Peak of the reference log-prob pass when beta > 0 and the reference is its own checkpoint (full
    fine-tuning after the first step): the policy's weights and its AdamW state (loaded before this pass
    when a run continues), the reference loaded whole in fp32 on every rank (`models.load`), and one
    layer of no-grad activations. Gradients do not exist yet."""
    b = budget(s, setup, p, seq=seq, micro_batch=micro_batch, padded=padded)
    t = seq * micro_batch
    one_layer = t * layer_activation_bytes(s, p.act, seq, padded, p.autocast)
    return b.weights + b.optimizer + 4 * param_count(s) + one_layer + lm_head_chunk_bytes()


def fits(total: int) -> bool:
    return total <= USABLE * GPU_GIB * GIB


# --- the generated tables ---------------------------------------------------------------------------

def _g(x: int) -> str:
    return f"{x / GIB:.1f}"


def shapes_table() -> str:
    rows = ["| model | hidden | layers | heads | KV heads | intermediate | vocab | tied | N (params) | LoRA r=16 "
            "| KV cache / token (bf16) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in TABLE_MODELS:
        s = QWEN25[name]
        rows.append(f"| [{name}]({s.source}) | {s.hidden} | {s.layers} | {s.heads} | {s.kv_heads} | "
                    f"{s.intermediate} | {s.vocab} | {'yes' if s.tied else 'no'} | {param_count(s):,} | "
                    f"{lora_param_count(s):,} | {kv_cache_bytes_per_token(s) // 1024} KiB |")
    return "\n".join(rows)


def budget_table(p: Precision, setups: tuple[str, ...]) -> str:
    rows = ["| model | setup | weights | grads | AdamW state | activations ckpt / no ckpt | transient | "
            "total ckpt | total no ckpt | fits 80 GB per GPU? |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in TABLE_MODELS:
        s = QWEN25[name]
        for u in setups:
            b = budget(s, SETUPS[u], p)
            nb = budget(s, SETUPS[u], p, checkpointing=False)
            verdict = {(True, True): "yes", (True, False): "with ckpt only", (False, False): "no"}[
                (fits(b.total), fits(nb.total))]
            rows.append(f"| {name} | {u} | {_g(b.weights)} | {_g(b.grads)} | {_g(b.optimizer)} | "
                        f"{_g(b.activations)} / {_g(nb.activations)} | {_g(b.transient)} | **{_g(b.total)}** | "
                        f"{_g(nb.total)} | {verdict} |")
    return "\n".join(rows)


def reference_table(p: Precision) -> str:
    rows = ["| model | setup | update peak (ckpt) | reference pass peak | fits 80 GB per GPU? |",
            "|---|---|---|---|---|"]
    for name in TABLE_MODELS:
        s = QWEN25[name]
        for u in ("1 GPU", f"DDP x{WORLD}", f"FSDP x{WORLD}"):
            total, ref = budget(s, SETUPS[u], p).total, reference_pass_bytes(s, SETUPS[u], p)
            rows.append(f"| {name} | {u} | {_g(total)} | {_g(ref)} | {'yes' if fits(max(total, ref)) else 'no'} |")
    return "\n".join(rows)


def sequence_table(name: str = "7B") -> str:
    s, p = QWEN25[name], PRECISIONS["bf16-autocast"]
    rows = [f"| {name}, --precision bf16, micro-batch | tokens / trajectory | padded | activations ckpt | no ckpt |",
            "|---|---|---|---|---|"]
    for b, seq, padded in ((1, 2048, False), (2, 2048, True), (1, 8192, False), (2, 8192, True),
                           (1, 32768, False), (2, 32768, True)):
        rows.append(f"| {b} | {seq} | {'yes' if padded else 'no'} | "
                    f"{_g(activation_bytes(s, p.act, seq, b, True, padded, p.autocast))} | "
                    f"{_g(activation_bytes(s, p.act, seq, b, False, padded, p.autocast))} |")
    return "\n".join(rows)


def generated() -> str:
    """The block of docs/scale.md between the markers."""
    mixed, ours, fp32 = (PRECISIONS[k] for k in ("bf16-mixed", "bf16-autocast", "fp32"))
    batch = f"{SEQ}-token trajectories, micro-batch {MICRO_BATCH}, padded"
    return "\n\n".join([
        BEGIN,
        "### The shapes (published config.json values)",
        shapes_table(),
        f"### bf16 mixed precision, ZeRO accounting (GiB per GPU; {batch}; fits = total <= {USABLE:.0%} of "
        f"{GPU_GIB} GiB)",
        budget_table(mixed, tuple(SETUPS)),
        f"### What grpo-step keeps: `--precision bf16`, the GPU default (GiB per GPU; {batch})",
        budget_table(ours, tuple(SETUPS)),
        f"### `--precision fp32`, the CPU default (GiB per GPU; {batch})",
        budget_table(fp32, ("1 GPU", f"DDP x{WORLD}", "LoRA, 1 GPU")),
        f"### With a separate reference model (beta > 0 after the first step, full fine-tuning; `--precision bf16`, "
        f"GiB per GPU; {batch})",
        reference_table(ours),
        "### Activations against sequence length (GiB per GPU)",
        sequence_table(),
        END,
    ])


def _split(text: str) -> tuple[str, str, str]:
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} has no generated block (markers {BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head, BEGIN + _ + END, tail


def check(doc: Path = DOC) -> bool:
    """True when the doc's generated block is exactly what this module computes."""
    return _split(doc.read_text())[1] == generated()


def write(doc: Path = DOC) -> None:
    head, _, tail = _split(doc.read_text())
    doc.write_text(head + generated() + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if docs/scale.md is out of date")
    group.add_argument("--write", action="store_true", help="rewrite the generated block of docs/scale.md")
    args = ap.parse_args(argv)
    if args.check:
        if check():
            return 0
        print(f"{DOC} is out of date: run `python -m atomcli.scale --write`", file=sys.stderr)
        return 1
    if args.write:
        write()
        return 0
    print(generated())
    return 0


if __name__ == "__main__":
    sys.exit(main())
