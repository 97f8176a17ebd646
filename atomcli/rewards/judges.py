"""Judges: the LLMs (and one stand-in) that read a prompt and write a verdict.

Built-in SPECs (registered with `atomcli.plugins`, like third-party judges):

- `openai:BASE_URL#MODEL` — any OpenAI-compatible server (vLLM, SGLang, TGI, the OpenAI API):
  `POST BASE_URL/chat/completions` (BASE_URL usually ends in `/v1`), greedy (temperature 0),
  `concurrency` requests in flight, transient faults (timeout, connection error, HTTP 429 and
  5xx) retried `retries` times in all with exponential backoff and jitter (a 429's
  Retry-After is honoured, capped), an optional rate limit (`rate` calls/s, shared by every
  judge on the same server in this process). The API key is read from the environment
  variable named by `api_key_env` (default OPENAI_API_KEY; unset = no Authorization header,
  fine for a local vLLM) and is never logged, stored in a table or written to metadata.
- `hf:MODEL` — a local transformers model loaded through `context.model(MODEL)` (`hf:smollm2`
  is the embedded demo model, works offline): batched greedy generation with the model's chat
  template, prompts sorted by length so that batches pad little.
- `heuristic` — NOT a reward model. A deterministic, offline stand-in that only understands
  `score-rrm` prompts (any other prompt gets a JudgeError) and scores each atomic thought by
  how well its content words are grounded in the question and the observations seen before
  it, with penalties for empty, very short and repeated thoughts and a bonus for reasoning
  tags (PLAN, REFLECTION, ...). See `heuristic_scores` for the exact formula. Use it for
  smoke tests, CI and the CPU demo; use an LLM judge for real training.

The judge interface (what `score-rrm`, `eval --judge` and the browse reader rely on)::

    judge.name: str                                   # the SPEC it was made from
    judge.complete(prompts: list[str]) -> list[str | JudgeError]

`complete` returns exactly one item per prompt, in order: the judge's reply text, or a
`JudgeError` (an Exception instance, returned, not raised) saying why there is no reply for
that prompt after the judge's own bounded retries. It does not raise for per-prompt faults;
a caller should still guard the call, since third-party judges may not be as careful. Each
prompt is sent as one user message; parsing the reply is the caller's business.

Factories are called as `factory(arg, context, **options)`. Options a judge does not use are
ignored, so that one call site can configure any SPEC: `concurrency`, `timeout`, `rate`,
`retries`, `backoff`, `api_key_env`, `max_new_tokens` (openai); `batch_size`,
`max_new_tokens` (hf).
"""

from __future__ import annotations

import json
import math
import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from atomcli import openai_http, plugins, retry
from atomcli.errors import InputError

# A reply of a few hundred tokens is a few KB; a server streaming more is broken or hostile,
# and reading it whole would hold it all in memory.
MAX_RESPONSE_BYTES = 1 << 20


class JudgeError(Exception):
    """Why a judge has no reply for one prompt (returned in place of the reply, not raised)."""


# --- openai: any OpenAI-compatible server ------------------------------------------------------

class OpenAIJudge:
    def __init__(self, spec: str, base_url: str, model: str, *, concurrency: int = 8, timeout: float = 120.0,
                 rate: float = 0.0, retries: int = 3, backoff: float = 1.0,
                 api_key_env: str = "OPENAI_API_KEY", max_new_tokens: int = 256):
        self.name = spec
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.concurrency = max(1, int(concurrency))
        self.timeout = float(timeout)
        self.max_new_tokens = int(max_new_tokens)
        self.policy = retry.RetryPolicy(attempts=max(1, int(retries)), base=float(backoff), cap=max(8.0, backoff))
        # one budget per server, shared with any other client of it in this process
        self.limiter = retry.limiter(f"judge:{urllib.parse.urlsplit(self.url).netloc}", rate)
        # Kept in memory only; every error message passes through _redact before it leaves.
        self._key = os.environ.get(api_key_env) or None

    def complete(self, prompts: list[str], progress=None) -> list[str | JudgeError]:
        if not prompts:
            return []

        def one(prompt: str) -> str | JudgeError:
            reply = self._one(prompt)
            if progress is not None:
                progress(1)
            return reply
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(one, prompts))

    def _one(self, prompt: str) -> str | JudgeError:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": 0.0, "max_tokens": self.max_new_tokens}).encode()
        try:
            # a server that echoes the key back in its reply must not get it into the table
            return self._redact(self.policy.call(self._post, body))
        except retry.ToolFault as e:
            return JudgeError(self._redact(f"{e} (after {self.policy.attempts} attempts)"))
        except JudgeError as e:
            return JudgeError(self._redact(str(e)))

    def _post(self, body: bytes) -> str:
        """One request: the reply text, or ToolFault (transient) / JudgeError (permanent)."""
        if self.limiter is not None:
            self.limiter.acquire()
        raw = openai_http.post_json(self.url, body, key=self._key, timeout=self.timeout,
                                    max_bytes=MAX_RESPONSE_BYTES, what="judge", permanent_error=JudgeError)
        try:
            obj = json.loads(raw)
            content = obj["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise JudgeError(f"judge response is not a chat completion: {raw[:200]!r}") from None
        if not isinstance(content, str):
            raise JudgeError("judge response has no text content")
        return content

    def _redact(self, text: str) -> str:
        return openai_http.redact(text, self._key)


@plugins.register_judge("openai")
def make_openai(arg: str, context, *, concurrency: int = 8, timeout: float = 120.0, rate: float = 0.0,
                retries: int = 3, backoff: float = 1.0, api_key_env: str = "OPENAI_API_KEY",
                max_new_tokens: int = 256, **_unused) -> OpenAIJudge:
    base_url, sep, model = arg.rpartition("#")
    if not sep or not base_url or not model.strip():
        raise InputError(f"judge SPEC `openai:{arg}` needs a model", hint="openai:BASE_URL#MODEL, "
                         "e.g. openai:http://localhost:8000/v1#Qwen/Qwen3-30B-A3B")
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"judge base url `{base_url}` is not an http(s) url",
                         hint="openai:http://HOST:PORT/v1#MODEL")
    if timeout <= 0 or rate < 0 or backoff < 0:
        raise InputError("judge timeout must be > 0, rate and backoff >= 0")
    return OpenAIJudge(f"openai:{arg}", base_url, model.strip(), concurrency=concurrency, timeout=timeout,
                       rate=rate, retries=retries, backoff=backoff, api_key_env=api_key_env,
                       max_new_tokens=max_new_tokens)


# --- hf: a local transformers model -------------------------------------------------------------

class HFJudge:
    def __init__(self, spec: str, model, tokenizer, *, batch_size: int = 8, max_new_tokens: int = 256):
        self.name = spec
        self.model, self.tok = model, tokenizer
        self.batch_size = max(1, int(batch_size))
        self.max_new_tokens = int(max_new_tokens)
        self.max_len = getattr(model.config, "max_position_embeddings", None)

    def _render(self, prompt: str) -> str:
        if getattr(self.tok, "chat_template", None):
            return self.tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                add_generation_prompt=True)
        return prompt

    def complete(self, prompts: list[str], progress=None) -> list[str | JudgeError]:
        out: list[str | JudgeError | None] = [None] * len(prompts)
        texts = [self._render(p) for p in prompts]
        lengths = [len(self.tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        for i, n in enumerate(lengths):
            # A prompt past the context would be silently truncated or garble: say so instead.
            if self.max_len and n + self.max_new_tokens > self.max_len:
                out[i] = JudgeError(f"prompt of {n} tokens + {self.max_new_tokens} new tokens "
                                    f"exceeds the judge's context ({self.max_len})")
        todo = sorted((i for i in range(len(prompts)) if out[i] is None), key=lengths.__getitem__)
        if progress is not None and len(todo) < len(prompts):
            progress(len(prompts) - len(todo))
        for start in range(0, len(todo), self.batch_size):
            batch = todo[start:start + self.batch_size]
            try:
                replies = self._generate([texts[i] for i in batch])
            except Exception as e:  # e.g. out of memory: lose this batch's replies, not the run
                replies = [JudgeError(f"generation failed: {type(e).__name__}: {str(e)[:200]}")] * len(batch)
            for i, r in zip(batch, replies):
                out[i] = r
            if progress is not None:
                progress(len(batch))
        return out

    def _generate(self, texts: list[str]) -> list[str]:
        import torch
        enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        with torch.inference_mode():
            gen = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      temperature=None, top_p=None, top_k=None, pad_token_id=pad)
        new = gen[:, enc["input_ids"].shape[1]:]
        return self.tok.batch_decode(new, skip_special_tokens=True)


@plugins.register_judge("hf")
def make_hf(arg: str, context, *, batch_size: int = 8, max_new_tokens: int = 256, **_unused) -> HFJudge:
    if not arg:
        raise InputError("judge SPEC `hf:` needs a model", hint="hf:smollm2 or hf:PATH_TO_CHECKPOINT")
    model, tok = context.model(arg)
    return HFJudge(f"hf:{arg}", model, tok, batch_size=batch_size, max_new_tokens=max_new_tokens)


# --- heuristic: a deterministic stand-in, not a reward model ---------------------------------

STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for with from into onto over under about as is are
was were be been being am do does did done have has had having it its this that these those there here
i me my we our you your he him his she her they them their what which who whom whose when where why how
not no yes so than too very can could should would may might must will shall just also only any some
all each more most other such own same again further once both few s t let lets need next now one
""".split())
REASONING_TAGS = frozenset({"PLAN", "REFLECTION", "HYPOTHESIS_TESTING", "RISK_ANALYSIS", "VERIFICATION",
                            "SELF_CORRECTION", "REASONING", "ANALYSIS", "CHECK", "SUMMARY"})


def content_words(text: str) -> list[str]:
    """Normalized tokens that carry meaning (stopwords and 1-letter tokens dropped)."""
    from atomcli.rewards.metrics import normalize
    return [w for w in normalize(text).split() if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]


def heuristic_scores(question: str, turns: list[tuple[list[tuple[str, str]], str | None]]) -> list[int]:
    """Score every thought 0-10; `turns` = [(thoughts [(tag, text)], observation after the turn)].

    For a thought in turn k, the *context* is the content words of the question and of the
    observations that came back after turns 1..k-1 (what the agent had seen when it wrote it).
    With W its content words and g = |W ∩ context| / |W| (the share of them that is grounded):

        score = 1 + 7·g  (+1 for a reasoning tag, −2 when |W| < 3)
        score = 0 when W is empty (an empty or stopword-only thought)
        score ≤ 1 when the thought repeats an earlier one (same content words, as a set)

    rounded half up and clipped to [0, 10]. It rewards staying on what was observed and
    penalizes filler; it cannot tell a correct inference from a wrong one.
    """
    context = set(content_words(question))
    seen: list[frozenset] = []
    scores = []
    for thoughts, observation in turns:
        for tag, text in thoughts:
            words = content_words(text)
            if not words:
                scores.append(0)
                continue
            grounded = sum(w in context for w in words) / len(words)
            score = 1 + 7 * grounded
            if tag.upper() in REASONING_TAGS:
                score += 1
            if len(words) < 3:
                score -= 2
            key = frozenset(words)
            if key in seen:
                score = min(score, 1)
            seen.append(key)
            scores.append(int(min(10, max(0, math.floor(score + 0.5)))))
        if observation:
            context |= set(content_words(observation))
    return scores


class HeuristicJudge:
    name = "heuristic"

    def complete(self, prompts: list[str]) -> list[str | JudgeError]:
        from atomcli.rewards.rrm_prompt import parse_prompt
        out: list[str | JudgeError] = []
        for p in prompts:
            parsed = parse_prompt(p)
            if parsed is None:
                out.append(JudgeError("the heuristic judge only scores `atom score-rrm` prompts"))
                continue
            question, steps = parsed
            out.append(json.dumps(heuristic_scores(question, [(s.thoughts, s.observation) for s in steps])))
        return out


@plugins.register_judge("heuristic")
def make_heuristic(arg: str, context, **_unused) -> HeuristicJudge:
    if arg:
        raise InputError(f"judge `heuristic` takes no argument (got `heuristic:{arg}`)", hint="--judge heuristic")
    return HeuristicJudge()
