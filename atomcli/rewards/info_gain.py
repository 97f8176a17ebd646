"""Information gain (IGPO): how likely a model finds the golden answer after each turn of a trajectory.

Owns the mechanics behind `atom score-ig` (docs/design.md, "Rewards and advantages"): the contexts a trajectory is cut
into, the answer turn teacher-forced after each of them, and the no-grad forward passes that
give the mean log-probability of the golden-answer tokens. No generation happens.

Contexts. A trajectory's token columns are one sequence `prompt_ids + completion_ids`; the
runs of 1s in `loss_mask` are its assistant turns (`agent.episode.turn_spans`). Context 0 is
the bare prompt (system prompt and question, ending with the opened assistant turn); context
t (t = 1..T) ends where turn t+1's sampled tokens start, so it holds turn t and what the
environment answered (tool response, the next turn's opening). After the last turn nothing
follows: its context is the whole trajectory plus the template text that closes it and opens
a new assistant turn (`tail_ids`). Every context is a prefix of one sequence.

Forced answer. After each context the answer turn of `agent.format.forced_answer_turn`
(`<think><REFLECTION>I have enough information to answer.</REFLECTION></think>
<answer>GOLD</answer>` and the template's end of turn) is tokenized with the scoring model's
tokenizer; the golden-answer tokens are located by character offsets, so a token that
merges with a neighbouring tag is counted where it is. The tokens after the answer cannot
change a causal model's probabilities of the answer, so they are not fed.

Two ways to compute the same numbers:
- `reuse_prefix` (default): one forward pass per trajectory over its longest context into a
  KV cache (the rollout engine's `GrowLayer`), then, from the longest context to the
  shortest, the cache is rewound to the context and only the forced answer is fed. Cost ~ one pass over the trajectory plus
  (T+1) x aliases short passes, instead of (T+1) x aliases passes over whole contexts.
- plain: every (context, alias) pair as its own sequence, right-padded in batches through
  `train.logprobs.sequence_logprobs` (only the answer positions reach the LM head), for
  models that bring their own cache type (`--no-reuse-prefix`); identical (context, alias) pairs (the bare prompt of
  every sample of a group) are computed once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from atomcli.agent import format as agent_format
from atomcli.agent.episode import turn_spans


@dataclass
class Forced:
    """The forced answer turn for one golden alias, as token ids, and where the answer tokens are."""
    alias: str
    ids: list[int]   # answer turn tokens up to and including the last answer token
    start: int       # first answer token in `ids`


@dataclass
class Template:
    """What the chat template writes around an assistant turn (measured by rendering probes)."""
    opening: str     # opens an assistant turn after a closed message ("<|im_start|>assistant\n")
    close: str       # ends an assistant turn ("<|im_end|>\n")


def template_texts(chat) -> Template:
    """The template's assistant opening and end of turn, from rendering a probe conversation."""
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    closed = chat.render(msgs)
    opened = chat.render(msgs, open_turn=True)
    probe = "PROBE"
    answered = chat.render(msgs + [{"role": "assistant", "content": probe}])
    opening = opened[len(closed):] if opened.startswith(closed) else ""
    close = answered[len(opened) + len(probe):] if answered.startswith(opened + probe) else ""
    return Template(opening, close)


def forced_answers(tok, golden: list, template: Template) -> list[Forced]:
    """The forced answer turn for every distinct non-empty alias (none when there is no usable alias)."""
    out, seen = [], set()
    for alias in golden or []:
        alias = alias.strip() if isinstance(alias, str) else ""
        if not alias or alias in seen:
            continue
        seen.add(alias)
        text, (a, b) = agent_format.forced_answer_turn(alias)
        full = text + template.close
        if getattr(tok, "is_fast", False):
            enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = enc["input_ids"], enc["offset_mapping"]
            hit = [k for k, (s, e) in enumerate(offsets) if s < b and e > a]
        else:  # no offsets: the three pieces tokenized apart
            enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
            head, gold = enc(full[:a]), enc(full[a:b])
            ids = head + gold + enc(full[b:])
            hit = list(range(len(head), len(head) + len(gold)))
        if hit:
            out.append(Forced(alias, list(ids[:hit[-1] + 1]), hit[0]))
    return out


def tail_ids(chat, ids: list[int], messages, template: Template) -> list[int]:
    """Tokens that close the trajectory's last turn and open a new assistant turn.

    The messages rendered with an open turn extend what the token columns decode to (the
    rollout keeps that invariant); the difference is the tail. A table whose messages do not
    render to its tokens gets the template's bare assistant opening."""
    text = chat.decode(ids)
    try:
        target = chat.render(list(messages), open_turn=True) if messages else None
    except Exception:  # a hand-made table's messages the template cannot render
        target = None
    if target is not None and target.startswith(text):
        return chat.encode(target[len(text):]) if len(target) > len(text) else []
    return chat.encode(template.opening)


@dataclass
class Job:
    """One trajectory to score: its sequence, the end of every context, the forced answers."""
    ids: list[int]
    ends: list[int]          # len(ends) = turns + 1; ends[0] = the bare prompt
    answers: list[Forced]


def contexts(prompt_ids: list[int], completion_ids: list[int], loss_mask: list[int], tail: list[int],
             head: int = 0) -> tuple[list[int], list[int]]:
    """(sequence, context ends) of a trajectory: ends[0] is the prompt, ends[t] follows turn t.

    head: tokens the environment wrote at the start of the last turn (a forced answer's head);
    the context before that turn ends before them."""
    spans = turn_spans(loss_mask)
    p = len(prompt_ids)
    ids = list(prompt_ids) + list(completion_ids)
    ends = [p] + [p + spans[k + 1][0] for k in range(len(spans) - 1)]
    if head and len(spans) >= 2:
        ends[-1] -= head
    if spans:
        ids += list(tail)
        ends.append(len(ids))
    return ids, ends


def gains(scores: list[float], mode: str) -> list[float]:
    """Turn rewards from the per-context scores (mean log-prob of the answer, best alias):
    score(t) - score(t-1) on log-probs, or on probabilities exp(score)."""
    vals = [math.exp(s) for s in scores] if mode == "prob" else list(scores)
    return [vals[t] - vals[t - 1] for t in range(1, len(vals))]


# --- forward passes ------------------------------------------------------------------------------

def _device(model):
    return next(model.parameters()).device


def score_jobs(model, jobs: list[Job], *, batch_size: int = 8, reuse_prefix: bool = True,
               progress: Callable[[float], None] | None = None) -> list[list[list[float]] | Exception]:
    """For each job, `scores[t][a]`: mean log-prob of alias a's answer tokens after context t.

    A job that fails (a context longer than the model's positions, a non-finite score) gets its
    exception instead of scores; the other jobs are unaffected. `progress(n)`: n more jobs' worth
    of work done (fractions with reuse_prefix off, where batches mix the jobs' contexts)."""
    report = progress or (lambda n: None)
    import torch
    out: list = [None] * len(jobs)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    live = []
    for i, job in enumerate(jobs):
        longest = max(job.ends) + max(len(f.ids) for f in job.answers)
        if limit and longest > limit:
            out[i] = ValueError(f"context and forced answer are {longest} tokens, the model's limit is {limit}")
        else:
            live.append(i)
    report(len(jobs) - len(live))
    with torch.no_grad():
        if reuse_prefix:
            for i in live:
                try:
                    out[i] = _check(_score_cached(model, jobs[i]))
                except (RuntimeError, ValueError) as e:
                    out[i] = e
                report(1)
        else:
            results = _score_plain(model, [jobs[i] for i in live], batch_size, report)
            for i, res in zip(live, results):
                try:
                    out[i] = _check(res)
                except ValueError as e:
                    out[i] = e
    return out


def _check(scores: list[list[float]]) -> list[list[float]]:
    for row in scores:
        for s in row:
            if not math.isfinite(s):
                raise ValueError(f"non-finite answer log-prob {s}")
    return scores


def _cache_kw(model) -> str:
    import inspect
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"  # transformers 5 renames it


def _score_cached(model, job: Job) -> list[list[float]]:
    import torch
    from transformers import DynamicCache

    from atomcli.engines.kv_cache import GrowLayer
    dev, kw = _device(model), _cache_kw(model)
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowLayer  # rewindable layers, room for the answers after the prefill
    top = max(job.ends) - 1
    if top > 0:
        model(input_ids=torch.tensor([job.ids[:top]], device=dev), use_cache=True, logits_to_keep=1, **{kw: cache})
    if not all(isinstance(layer, GrowLayer) for layer in cache.layers):
        raise TypeError(f"{type(model).__name__} made its own KV cache; pass --no-reuse-prefix")
    scores = [[0.0] * len(job.answers) for _ in job.ends]
    # longest context first: an answer fed after context c overwrites only cache slots >= c - 1,
    # which no shorter context reads
    for t in sorted(range(len(job.ends)), key=lambda t: -job.ends[t]):
        c = job.ends[t]
        for a, f in enumerate(job.answers):
            for layer in cache.layers:
                layer.rewind(c - 1)
            # the context's last token predicts the answer turn's first; answer token k is predicted at k
            x = torch.tensor([[job.ids[c - 1]] + f.ids[:-1]], device=dev)
            logits = model(input_ids=x, use_cache=True, **{kw: cache}).logits[0, f.start:].float()
            target = torch.tensor(f.ids[f.start:], device=dev)
            lp = torch.log_softmax(logits, -1).gather(-1, target[:, None]).squeeze(-1)
            scores[t][a] = lp.double().mean().item()
    return scores


def _score_plain(model, jobs: list[Job], batch_size: int, report: Callable[[float], None] = lambda n: None
                 ) -> list[list[list[float]]]:
    import torch

    from atomcli.train.logprobs import sequence_logprobs
    dev = _device(model)
    keys: dict[tuple, int] = {}   # (context ids, answer ids) -> item, so repeats are computed once
    items: list[tuple[list[int], int, list[int]]] = []  # (sequence, first answer position, answer ids)
    where = []
    for job in jobs:
        w = []
        for c in job.ends:
            row = []
            for f in job.answers:
                key = (tuple(job.ids[:c]), tuple(f.ids))
                if key not in keys:
                    keys[key] = len(items)
                    items.append((job.ids[:c] + f.ids[:-1], c + f.start, f.ids[f.start:]))
                row.append(keys[key])
            w.append(row)
        where.append(w)
    means = [0.0] * len(items)
    order = sorted(range(len(items)), key=lambda k: len(items[k][0]))
    pad = 0
    for s in range(0, len(order), batch_size):
        chunk = order[s:s + batch_size]
        length = max(len(items[k][0]) for k in chunk)
        ids = torch.full((len(chunk), length), pad, dtype=torch.long)
        att = torch.zeros((len(chunk), length), dtype=torch.long)
        rows, cols, targets, owner = [], [], [], []
        for b, k in enumerate(chunk):
            seq, first, answer = items[k]
            ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            att[b, :len(seq)] = 1
            rows += [b] * len(answer)
            cols += range(first - 1, first - 1 + len(answer))  # the hidden state before each answer token
            targets += answer
            owner += [k] * len(answer)
        as_long = lambda x: torch.tensor(x, dtype=torch.long, device=dev)  # noqa: E731
        logp, _ = sequence_logprobs(model, ids.to(dev), att.to(dev), as_long(rows), as_long(cols), as_long(targets))
        sums: dict[int, list[float]] = {}
        for k, v in zip(owner, logp.double().tolist()):
            sums.setdefault(k, []).append(v)
        for k, vs in sums.items():
            means[k] = math.fsum(vs) / len(vs)
        report(len(jobs) * len(chunk) / len(items))
    return [[[means[k] for k in row] for row in w] for w in where]
