"""Per-token log-probabilities (and entropies) of chosen tokens, without the full logits.

A causal LM's `(tokens, vocab)` logits are the largest tensor of a policy-gradient step
(SmolLM2: 49k entries per token, four copies live in a naive log_softmax backward). Only
the positions that enter the loss matter, so `sequence_logprobs` runs the model's backbone,
gathers the hidden states that predict the scored tokens, and `ChunkedTokenLogProb` projects
them through the LM head a few rows at a time, recomputing each chunk in the backward pass
with the analytic gradient. Peak memory is one chunk of logits instead of the whole batch.

Models whose head rescales logits (logit_scale, soft-capping) take the plain path through
the model's own forward, which is exact but materializes the logits.
"""

from __future__ import annotations

from typing import Any

# logits entries per chunk: two chunk-sized fp32 buffers live at a time. Small on CPU (memory is
# the constraint, and 85+ rows already keep the matmul efficient); larger on GPUs so that each
# chunk amortizes one read of the (vocab x hidden) head weight.
CHUNK_ELEMENTS = {"cpu": 1 << 22, "other": 1 << 26}


def _chunk_rows(vocab: int, device) -> int:
    budget = CHUNK_ELEMENTS["cpu" if device.type == "cpu" else "other"]
    return max(16, budget // max(vocab, 1))


def _autograd_function():
    import torch

    class ChunkedTokenLogProb(torch.autograd.Function):
        """log p(target) and entropy of softmax(hidden @ weight.T + bias) / temperature, per row."""

        @staticmethod
        def forward(ctx, hidden, weight, bias, targets, inv_temp: float):
            n, rows = hidden.shape[0], _chunk_rows(weight.shape[0], hidden.device)
            dt = torch.promote_types(hidden.dtype, torch.float32)
            logp, ent, log_z = (hidden.new_empty(n, dtype=dt) for _ in range(3))
            for s in range(0, n, rows):
                z = _logits(hidden[s:s + rows], weight, bias, inv_temp)
                m = z.amax(-1)
                target_z = z.gather(-1, targets[s:s + rows, None]).squeeze(-1)
                z.sub_(m[:, None])
                e = z.exp()
                total = e.sum(-1)
                # with z' = z - max: log Z = max + log sum e, entropy = log sum e - sum(e z') / sum e
                ent[s:s + rows] = total.log() - e.mul_(z).sum(-1) / total
                log_z[s:s + rows] = m + total.log()
                logp[s:s + rows] = target_z - log_z[s:s + rows]
            ctx.save_for_backward(hidden, weight, bias, targets, log_z, ent)
            ctx.inv_temp = inv_temp
            # the backward recomputes the logits: under the same autocast as here (bf16 mixed precision),
            # or they would not match the saved log Z
            kind = hidden.device.type
            ctx.autocast = (kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
            return logp, ent

        @staticmethod
        def backward(ctx, g_logp, g_ent):
            kind, enabled, dtype = ctx.autocast
            with torch.autocast(kind, dtype=dtype, enabled=enabled):
                return ChunkedTokenLogProb._backward(ctx, g_logp, g_ent)

        @staticmethod
        def _backward(ctx, g_logp, g_ent):
            hidden, weight, bias, targets, log_z, ent = ctx.saved_tensors
            inv_temp = ctx.inv_temp
            need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            need_b = bias is not None and ctx.needs_input_grad[2]
            grad_h = torch.zeros_like(hidden) if need_h else None
            acc = torch.promote_types(weight.dtype, torch.float32)  # accumulate head gradients in fp32 at least
            grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
            grad_b = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_b else None
            rows = _chunk_rows(weight.shape[0], hidden.device)
            for s in range(0, hidden.shape[0] if (g_logp is not None or g_ent is not None) else 0, rows):
                h = hidden[s:s + rows]
                # two chunk-sized buffers, updated in place: `a` = log p, `b` = p
                a = _logits(h, weight, bias, inv_temp).sub_(log_z[s:s + rows, None])
                b = a.exp()
                if g_ent is not None:  # d H / dz = -p * (log p + H)
                    a.add_(ent[s:s + rows, None]).mul_(b).mul_(-g_ent[s:s + rows, None].to(a.dtype))
                if g_logp is not None:  # d log p_t / dz = onehot(t) - p
                    g = g_logp[s:s + rows, None].to(b.dtype)
                    b.mul_(-g).scatter_add_(-1, targets[s:s + rows, None], g)
                    gz = b.add_(a) if g_ent is not None else b
                else:
                    gz = a
                gz = gz.mul_(inv_temp).to(weight.dtype) if inv_temp != 1.0 else gz.to(weight.dtype)
                if need_h:
                    grad_h[s:s + rows] = gz @ weight
                if need_w:
                    grad_w.addmm_(gz.t().to(acc), h.to(acc))
                if need_b:
                    grad_b += gz.sum(0).to(acc)
            return (grad_h, grad_w.to(weight.dtype) if need_w else None,
                    grad_b.to(bias.dtype) if need_b else None, None, None)

    return ChunkedTokenLogProb


def _logits(h, weight, bias, inv_temp):
    import torch
    z = torch.nn.functional.linear(h, weight, bias)
    if z.dtype in (torch.float16, torch.bfloat16):  # softmax statistics in fp32 at least
        z = z.float()
    return z.mul_(inv_temp) if inv_temp != 1.0 else z


_FUNCTION: Any = None


def token_logprobs(hidden, weight, bias, targets, temperature: float = 1.0):
    """(log p(target), entropy) for each row of `hidden` ([n, H]) through the head `weight` ([V, H])."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _autograd_function()
    return _FUNCTION.apply(hidden, weight, bias, targets, 1.0 / temperature)


def causal_lm(model):
    """The transformers causal LM inside a (possibly peft-wrapped) model."""
    import sys
    peft = sys.modules.get("peft")  # a peft model exists only once peft is imported (it costs seconds)
    return model.get_base_model() if peft is not None and isinstance(model, peft.PeftModel) else model


def _plain_head(lm) -> bool:
    cfg = lm.config.get_text_config()
    scale = getattr(cfg, "logit_scale", None)
    return getattr(cfg, "final_logit_softcapping", None) is None and scale in (None, 1.0)


def sequence_logprobs(model, input_ids, attention_mask, rows, cols, targets, temperature: float = 1.0):
    """Log-prob and entropy of `targets[k]` predicted at position `cols[k]` of sequence `rows[k]`.

    `input_ids`/`attention_mask`: [B, L], right-padded. Returns two float32 tensors of shape [n]."""
    import torch
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    if _plain_head(lm):
        hidden = lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return token_logprobs(hidden[rows, cols], head.weight, head.bias, targets, temperature)
    logits = lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[rows, cols].float()
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets[:, None]).squeeze(-1), ent
