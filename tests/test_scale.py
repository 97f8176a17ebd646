"""The memory arithmetic of atomcli/scale.py (docs/scale.md) against real models.

Parameter counts are checked exactly on the published Qwen2.5 shapes (built on the meta device:
no memory) and on small random-init cousins; optimizer-state bytes on cousins after one AdamW
step through grpo-step's own `make_optimizer`; activation bytes against what autograd saves
(saved-tensor hooks) in a real forward pass.
"""

from __future__ import annotations

import dataclasses

import pytest

from atomcli import scale
from atomcli.train.checkpointing import enable as enable_checkpointing

torch = pytest.importorskip("torch")

# the same architecture as the published shapes, small: (hidden, layers, heads, kv_heads, intermediate, vocab, tied)
COUSINS = [scale.Shape("cousin-tied", 64, 2, 4, 2, 160, 1000, True),
           scale.Shape("cousin-untied", 96, 3, 6, 2, 224, 1200, False)]


def qwen2(shape: scale.Shape, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype)


def state_bytes(optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
               if torch.is_tensor(t))


def one_step(model, optimizer) -> None:
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    model(input_ids=ids, labels=ids).loss.float().backward()
    optimizer.step()


@pytest.mark.parametrize("name", sorted(scale.QWEN25))
def test_published_shapes_count_exactly(name):
    shape = scale.QWEN25[name]
    with torch.device("meta"):
        model = qwen2(shape)
    params = list(model.parameters())  # tied embeddings appear once
    assert sum(p.numel() for p in params) == scale.param_count(shape)
    assert len(params) == scale.param_tensors(shape)
    assert sum(p.numel() for p in model.model.layers[0].parameters()) == scale.layer_params(shape)


@pytest.mark.parametrize("shape", COUSINS, ids=lambda s: s.name)
def test_adamw_state_of_grpo_steps_optimizer(shape):
    """fp32 (what grpo-step keeps today) and the model cast to bf16: weights, gradients, moments, step."""
    from atomcli.train.grpo import make_optimizer
    for precision, dtype in (("fp32", torch.float32), ("bf16-pure", torch.bfloat16)):
        p = scale.PRECISIONS[precision]
        model = qwen2(shape, dtype)
        n = sum(t.numel() for t in model.parameters())
        assert n == scale.param_count(shape)
        optimizer = make_optimizer(model, lr=1e-3)
        one_step(model, optimizer)
        assert sum(t.numel() * t.element_size() for t in model.parameters()) == p.weight * n
        assert sum(t.grad.numel() * t.grad.element_size() for t in model.parameters()) == p.grad * n
        assert state_bytes(optimizer) == scale.adamw_state_bytes(n, scale.param_tensors(shape), p)
        b = scale.budget(shape, scale.SETUPS["1 GPU"], p)
        assert (b.weights, b.grads, b.optimizer) == (p.weight * n, p.grad * n, state_bytes(optimizer))


@pytest.mark.parametrize("shape", COUSINS, ids=lambda s: s.name)
def test_lora_counts_and_state(shape):
    """grpo-step --lora's adapter (all-linear, r = 16) over a bf16 base: peft keeps it in fp32."""
    from peft import LoraConfig, get_peft_model

    from atomcli.train.grpo import make_optimizer
    r = scale.LORA_R
    model = get_peft_model(qwen2(shape, torch.bfloat16),
                           LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules="all-linear",
                                      task_type="CAUSAL_LM"))
    trainable = [t for t in model.parameters() if t.requires_grad]
    nl = sum(t.numel() for t in trainable)
    assert nl == scale.lora_param_count(shape, r)
    assert len(trainable) == scale.lora_tensors(shape)
    assert {t.dtype for t in trainable} == {torch.float32}
    optimizer = make_optimizer(model, lr=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        one_step(model, optimizer)
    b = scale.budget(shape, scale.SETUPS["LoRA, 1 GPU"], scale.PRECISIONS["bf16-mixed"])
    assert b.optimizer == state_bytes(optimizer)
    assert b.weights == sum(t.numel() * t.element_size() for t in model.parameters())


def saved_bytes(shape: scale.Shape, dtype, batch: int, seq: int, padded: bool, checkpointing: bool,
                autocast: bool) -> int:
    """Bytes of the distinct storages autograd saves in one forward pass (parameters excluded).

    autocast: fp32 weights under torch.autocast(bf16), as accelerate's mixed_precision=bf16 runs them."""
    model = qwen2(shape, torch.float32 if autocast else dtype)
    model.train()
    if checkpointing:
        enable_checkpointing(model)
    ids = torch.randint(0, shape.vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        mask[0, -3:] = 0  # right padding, as grpo-step's micro-batches
    seen: dict[tuple[int, int], int] = {}

    def pack(t):
        st = t.untyped_storage()
        seen[(st.data_ptr(), st.nbytes())] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model.model(input_ids=ids, attention_mask=mask, use_cache=False)
    params = {t.untyped_storage().data_ptr() for t in model.parameters()}
    return sum(v for (ptr, _), v in seen.items() if ptr not in params)


@pytest.mark.parametrize("precision", ["bf16-pure", "fp32", "bf16-autocast"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_activation_formula_matches_what_autograd_saves(precision, padded):
    """Per layer and token: the difference between a 3-layer and a 1-layer model, over b·s tokens."""
    p = scale.PRECISIONS[precision]
    dtype = {2: torch.bfloat16, 4: torch.float32}[p.act]
    batch, seq = 2, 128
    for base in COUSINS:
        one, three = (dataclasses.replace(base, layers=k) for k in (1, 3))
        layer = [(saved_bytes(three, dtype, batch, seq, padded, ckpt, p.autocast)
                  - saved_bytes(one, dtype, batch, seq, padded, ckpt, p.autocast)) / 2 for ckpt in (False, True)]
        casts = p.act * scale.matrix_params(base) if p.autocast else 0  # autocast's bf16 weight copies
        assert (layer[0] - casts) / (batch * seq) == pytest.approx(
            scale.layer_activation_bytes(base, p.act, seq, padded, p.autocast), rel=0.03)
        # gradient checkpointing keeps each layer's input only: the residual stream, fp32 under autocast
        assert layer[1] / (batch * seq) == (4 if p.autocast else p.act) * base.hidden


def test_scale_doc_is_generated_from_the_module():
    assert scale.check(), "docs/scale.md is out of date: run `python -m atomcli.scale --write`"
    assert scale.main(["--check"]) == 0


def test_fitting_verdicts_that_the_doc_states():
    mixed, fp32 = scale.PRECISIONS["bf16-mixed"], scale.PRECISIONS["fp32"]
    s7 = scale.QWEN25["7B"]
    assert not scale.fits(scale.budget(s7, scale.SETUPS["1 GPU"], mixed).total)
    assert scale.fits(scale.budget(s7, scale.SETUPS[f"FSDP x{scale.WORLD}"], mixed).total)
    assert scale.fits(scale.budget(s7, scale.SETUPS["LoRA, 1 GPU"], fp32).total)
    assert not scale.fits(scale.budget(scale.QWEN25["14B"], scale.SETUPS["LoRA, 1 GPU"], fp32).total)
