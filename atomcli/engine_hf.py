"""The in-process rollout engine: batched, KV-cached sampling with a transformers model.

`HFEngine.generate(requests)` advances every request by one assistant turn in one batched
decode loop: the contexts are left-padded and prefilled together, then each step samples
one token per row, and a row leaves the batch (its KV rows are dropped) as soon as it ends:
at a stop string, at an end-of-sequence token, or at its own token cap.

This is our own loop rather than `model.generate` because the rollout needs three things
`generate` does not give directly:

- the exact ids sampled, cut at the token that completes the stop string (never decoded
  text re-tokenized; whatever else that last token carries is kept, because it was sampled);
- the log-prob of each sampled token under the *policy*: log-softmax of the raw logits
  (temperature 1, no top-p), which is what a fresh forward pass of the same model gives and
  what the GRPO ratio needs. It comes free from the logits the step computes anyway, so no
  second forward pass is spent on it;
- one `torch.Generator` per request, seeded by the caller, so a trajectory's samples do not
  depend on which other trajectories share its batch (resume and `--shard` reproduce a full
  run). Floating-point results can still differ in the last bits between batch shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class GenRequest:
    """One turn to sample: the full context so far and how to sample it."""
    ids: list[int]
    max_new_tokens: int
    seed: int = 0
    temperature: float = 1.0   # 0 = greedy
    top_p: float = 1.0
    stops: tuple[str, ...] = ()


@dataclass
class GenResult:
    """What was sampled. `stop`: "stop" (a stop string), "eos", "length" (token cap) or "error"."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop: str = "length"
    error: str | None = None
    exact: bool = True  # False: ids re-tokenized from text (an OpenAI server that hides ids)


def eos_ids(model, tok) -> set[int]:
    """Every id that ends a turn: the generation config's eos ids and the tokenizer's."""
    ids: set[int] = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tok.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(i) for i in src)
    return ids


class StopScanner:
    """Finds the token at which a stop string is first complete, one token at a time."""

    def __init__(self, tok, stops: tuple[str, ...]):
        self.tok, self.stops = tok, tuple(s for s in stops if s)
        self.keep = max((len(s) for s in self.stops), default=0)
        self.tail = ""

    def push(self, token_id: int, pieces: dict[int, str]) -> bool:
        if not self.stops:
            return False
        piece = pieces.get(token_id)
        if piece is None:
            # Single-token decode can show a lone byte as U+FFFD; stop strings are ASCII tags,
            # so this never hides or invents a match.
            piece = pieces[token_id] = self.tok.decode([token_id], skip_special_tokens=False,
                                                        clean_up_tokenization_spaces=False)
        self.tail = (self.tail + piece)[-(self.keep + len(piece)):]
        return any(s in self.tail for s in self.stops)


class HFEngine:
    """Batched multi-row sampling with a (model, tokenizer) pair; see the module docstring."""

    kind = "hf"

    def __init__(self, spec: str, model, tok, *, batch_size: int = 16):
        self.name, self.model, self.tokenizer = spec, model, tok
        self.batch_size = max(1, int(batch_size))
        self.eos = eos_ids(model, tok)
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else min(self.eos or {0})
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._pieces: dict[int, str] = {}
        # transformers 5 renames `past_key_values` to `cache` (the old name warns, then goes away)
        import inspect
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.generated_tokens = 0
        self.seconds = 0.0

    def provenance(self) -> dict:
        return {"engine": self.kind, "tokens": "exact"}

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """One turn for every request, `batch_size` rows at a time (longest contexts together)."""
        out: list[GenResult | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].ids))
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            for i, r in zip(idx, self._generate_batch([requests[i] for i in idx])):
                out[i] = r
        return out  # type: ignore[return-value]

    def complete(self, prompts: list[str], max_new_tokens: int = 256) -> list[str]:
        """Greedy replies to single-user-message prompts (the browse reader's interface)."""
        tok = self.tokenizer
        reqs = []
        for p in prompts:
            text = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) if tok.chat_template else p
            reqs.append(GenRequest(tok(text, add_special_tokens=False)["input_ids"], max_new_tokens,
                                   temperature=0.0))
        return [tok.decode([i for i in r.ids if i not in self.eos], skip_special_tokens=True)
                for r in self.generate(reqs)]

    # --- the decode loop ------------------------------------------------------------------

    def _generate_batch(self, reqs: list[GenRequest]) -> list[GenResult]:
        import torch
        from transformers import DynamicCache

        t0 = time.time()
        results = [GenResult() for _ in reqs]
        live = [i for i, r in enumerate(reqs) if r.max_new_tokens > 0]
        if not live:
            return results
        dev = self.model.device
        width = max(len(reqs[i].ids) for i in live)
        input_ids = torch.full((len(live), width), self.pad, dtype=torch.long)
        attn = torch.zeros((len(live), width), dtype=torch.long)
        for row, i in enumerate(live):
            n = len(reqs[i].ids)
            input_ids[row, width - n:] = torch.tensor(reqs[i].ids, dtype=torch.long)
            attn[row, width - n:] = 1
        # With left padding the positions must count real tokens only, or RoPE shifts.
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        input_ids, attn, pos = input_ids.to(dev), attn.to(dev), pos.to(dev)
        gens = {i: torch.Generator().manual_seed(int(reqs[i].seed)) for i in live}
        scanners = {i: StopScanner(self.tokenizer, reqs[i].stops) for i in live}
        temps = torch.tensor([float(reqs[i].temperature) for i in live])
        top_ps = torch.tensor([float(reqs[i].top_p) for i in live])
        cache = DynamicCache()
        with torch.inference_mode():
            logits = self.model(input_ids=input_ids, attention_mask=attn, position_ids=pos,
                                use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}).logits[:, -1, :]
            last_pos = pos[:, -1]
            rows = list(live)
            while rows:
                chosen, logp = _sample(logits.float(), temps, top_ps, [gens[i] for i in rows])
                keep = []
                for j, i in enumerate(rows):
                    t = int(chosen[j])
                    res = results[i]
                    res.ids.append(t)
                    res.logprobs.append(float(logp[j]))
                    if t in self.eos:
                        res.stop = "eos"
                    elif scanners[i].push(t, self._pieces):
                        res.stop = "stop"
                    elif len(res.ids) >= reqs[i].max_new_tokens:
                        res.stop = "length"
                    else:
                        keep.append(j)
                if not keep:
                    break
                if len(keep) < len(rows):  # finished rows leave the batch, KV rows included
                    sel = torch.tensor(keep, device=dev)
                    cache.batch_select_indices(sel)
                    attn, last_pos, chosen = attn[sel], last_pos[sel], chosen[keep]
                    temps, top_ps = temps[keep], top_ps[keep]
                    rows = [rows[j] for j in keep]
                attn = torch.cat([attn, attn.new_ones((len(rows), 1))], dim=1)
                last_pos = last_pos + 1
                logits = self.model(input_ids=chosen[:, None].to(dev), attention_mask=attn,
                                    position_ids=last_pos[:, None], use_cache=True,
                                    **{self._cache_kw: cache}).logits[:, -1, :]
        self.generated_tokens += sum(len(r.ids) for r in results)
        self.seconds += time.time() - t0
        return results


def _sample(logits, temps, top_ps, gens):
    """Per-row sampling; returns (chosen ids, their log-prob under the raw logits)."""
    import torch
    logits = logits.cpu()
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logits.argmax(dim=-1)
    sampled = (temps > 0).nonzero().flatten().tolist()
    if sampled:
        z = logits[sampled] / temps[sampled, None]
        probs = torch.softmax(z, dim=-1)
        p = top_ps[sampled]
        if bool((p < 1).any()):
            sp, si = probs.sort(dim=-1, descending=True)
            # drop a token when the mass before it already reaches top_p (the top token always stays)
            drop = (sp.cumsum(-1) - sp) >= p[:, None]
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        # Inverse-CDF sampling with one uniform draw per row from the row's own generator
        # (torch.multinomial is ~100x slower on a 49k vocabulary). `right=True` lands on a
        # token whose probability is > 0, and u < 1 keeps the index inside the vocabulary.
        cdf = probs.double().cumsum(-1)
        u = torch.cat([torch.rand(1, generator=gens[j], dtype=torch.float64) for j in sampled])
        picks = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        chosen[sampled] = picks.clamp(max=probs.shape[-1] - 1)
    return chosen, logp.gather(-1, chosen[:, None]).squeeze(-1)
