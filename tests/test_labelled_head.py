"""The SFT LM head on labelled positions only: the same loss and gradients from fewer projected rows."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer import utils as trl_utils

from atomcli.train import labelled_head


def _model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 300, (2, 40), generator=g)
    labels = ids.clone()
    labels[:, :25] = -100   # a prompt and a tool response: no loss
    labels[1, 32:] = -100   # padding of the shorter row
    attn = torch.ones_like(ids)
    attn[1, 32:] = 0
    return ids, labels, attn


def _loss_grads_rows(monkeypatch, compact: bool):
    """Loss, gradients and the row counts the fused head projected, with or without the patch."""
    model = _model()
    ids, labels, attn = _batch()
    rows = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        rows.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    with labelled_head.labelled_positions_only() if compact else contextlib.nullcontext():
        out = model(input_ids=ids, attention_mask=attn, labels=labels, fused_lm_head=True)
        out.loss.backward()
    monkeypatch.undo()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out, grads, rows


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA TRL already projects labelled positions only")
def test_cpu_projects_only_labelled_rows_and_gets_the_same_loss_and_gradients(monkeypatch):
    full, full_grads, full_rows = _loss_grads_rows(monkeypatch, compact=False)
    part, part_grads, part_rows = _loss_grads_rows(monkeypatch, compact=True)
    labelled = int((_batch()[1][:, 1:] != -100).sum())
    assert full_rows == [2 * 39] and part_rows == [labelled] and labelled < 2 * 39 / 2
    torch.testing.assert_close(part.loss, full.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(part.entropy, full.entropy, rtol=1e-5, atol=1e-6)
    assert torch.equal(part.is_top1, full.is_top1)
    for name, grad in full_grads.items():
        torch.testing.assert_close(part_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_patch_is_undone_after_the_block_even_on_error():
    original = trl_utils._use_triton
    with pytest.raises(ValueError), labelled_head.labelled_positions_only():
        assert trl_utils._use_triton(torch.device("cpu"))
        raise ValueError("boom")
    assert trl_utils._use_triton is original


def test_a_trl_without_the_patched_function_trains_as_trl_does(monkeypatch):
    monkeypatch.delattr(trl_utils, "_use_triton")
    with labelled_head.labelled_positions_only():
        assert not hasattr(trl_utils, "_use_triton")
    assert not hasattr(trl_utils, "_use_triton")
