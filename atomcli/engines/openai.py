"""The rollout engine for OpenAI-compatible servers (`--model openai:BASE_URL#MODEL`).

Same contract as the in-process engine (`atomcli.engines.hf`): one assistant turn per request,
exact ids and their log-probs back. The rollout keeps control of the chat template: it
renders and tokenizes with a *local* tokenizer of the served model (`--tokenizer`, default
the model name after `#`) and sends `POST BASE_URL/completions` (not chat completions) with
the context as token ids (`--no-prompt-ids`: as text), so the server continues exactly the
tokens the table records. Requests run `concurrency` at a time (stdlib HTTP, no client
library), with the stop strings, a per-request seed and `logprobs: 1`.

Token ids come back exactly when the server supports vLLM's `return_tokens_as_token_ids`
(tokens arrive as `token_id:N`; SGLang and vLLM also take token-id prompts). A server that
only returns text is handled by re-tokenizing the text locally: the provenance then says
`tokens: "retokenized"`, and a log-prob the server's tokens cannot be aligned with is NaN
(loud, never a made-up number), so `grpo-step` must recompute old log-probs for such tables.
vLLM reports log-probs of the raw model distribution (before temperature/top-p), the same
definition the in-process engine records.

Servers that refuse what they do not know: the first request carries vLLM's extension fields.
`transformers serve` answers HTTP 422 "Unexpected fields in the request: {...}" (its request
validation) and 400 "prompt must be a string." (it takes no token-id prompt); the engine then
drops the fields it named, sends the context as text, and retries the request, once per thing
learned, and remembers it for the rest of the run. A server that refused that way is
`transformers serve`: it returns neither token ids nor log-probs (the `retokenized` route,
NaN old log-probs), and its sampling starts from the *model's* generation config, in which
`do_sample` is usually unset, so a temperature-1 request would be decoded greedily: the engine
sends `generation_config: {"do_sample": true, "top_k": 0}` to sample as the in-process engine
does. On the text route the ids are cut at the first token whose text completes a stop string
(the in-process engine's rule), since a server may run past a stop (transformers' continuous
batching ignores `stop`). A text prompt drops a leading BOS that the server's tokenizer adds
itself (a server tokenizes a text prompt with its special tokens).

Faults: timeouts, connection errors, HTTP 429 and 5xx are retried (`retries` attempts in all,
exponential backoff with jitter, Retry-After honoured); when they persist the run stops with a
clear error (the policy server is down: completed groups are kept for `--resume`). Any other
HTTP error concerns one request (e.g. a prompt longer than the server's context) and ends
that trajectory with `finish_reason = error`, unless the server has refused every request so
far: a whole batch refused before any request succeeded stops the run with the server's
answer (`EngineError`), as a server that is down does. The API key, if any, is read from
OPENAI_API_KEY and never logged or stored.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from atomcli import openai_http, retry
from atomcli.engines.base import GenRequest, GenResult
from atomcli.errors import InputError

NAN = float("nan")
# A completion of thousands of tokens with their log-probs is a few MB; a server sending far
# more is broken or hostile, and reading it whole would hold it all in memory.
MAX_RESPONSE_BYTES = 64 << 20
# vLLM/SGLang extensions: exact ids back, stop strings kept, special tokens spelled out
VLLM_FIELDS = {"return_tokens_as_token_ids": True, "include_stop_str_in_output": True,
               "skip_special_tokens": False, "spaces_between_special_tokens": False}
# `transformers serve`'s answers to what it does not take (transformers/cli/serving/utils.py
# `BaseHandler._validate_request`, completion.py `CompletionHandler.handle_request`)
UNEXPECTED_FIELDS = "Unexpected fields in the request"
TEXT_PROMPT_ONLY = "prompt must be a string"
TRANSFORMERS_KIND = "transformers"


class EngineError(RuntimeError):
    """The policy server failed past its retries; the rollout cannot go on."""


class RequestError(Exception):
    """A permanent failure of one request (its trajectory ends with `error`)."""


def refused_fields(message: str) -> set[str]:
    """The field names of a `transformers serve` 422 ("Unexpected fields in the request: {'a', 'b'}")."""
    if UNEXPECTED_FIELDS not in message:
        return set()
    return set(re.findall(r"'([A-Za-z_][A-Za-z0-9_]*)'", message.split(UNEXPECTED_FIELDS, 1)[1]))


def parse_spec(spec: str) -> tuple[str, str]:
    """`openai:BASE_URL#MODEL` -> (completions url, model)."""
    from atomcli.safety import check_no_secret
    check_no_secret(spec, "model SPEC")  # the SPEC is stored (policy column, provenance): no key in it
    arg = spec[len("openai:"):] if spec.startswith("openai:") else spec
    base_url, sep, model = arg.rpartition("#")
    parts = urllib.parse.urlsplit(base_url)
    if not sep or not model.strip():
        raise InputError(f"model SPEC `{spec}` needs a model name", hint="openai:http://HOST:PORT/v1#MODEL")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InputError(f"model base url `{base_url}` is not an http(s) url", hint="openai:http://HOST:PORT/v1#MODEL")
    return base_url.rstrip("/") + "/completions", model.strip()


def load_tokenizer(spec: str, context, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    from atomcli import models
    path = models.resolve(spec, context.home, context.log)
    try:
        # explicit: left as None, transformers asks on stdin (and prints to stdout) whether to
        # run a tokenizer folder's own code, so a piped "y" would run it
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load the tokenizer `{spec}` for the OpenAI engine ({str(e).splitlines()[0][:150]})",
                         hint="pass --tokenizer: a local folder with the served model's tokenizer") from None


def make(config, context) -> "OpenAIEngine":
    url, model = parse_spec(config.model)
    tok = load_tokenizer(config.tokenizer or model, context, config.trust_remote_code)
    return OpenAIEngine(config.model, url, model, tok, concurrency=config.concurrency, timeout=config.timeout,
                        retries=config.retries, prompt_ids=config.prompt_ids)


class OpenAIEngine:
    kind = "openai"
    pool_factor = 1  # one turn for --batch-size trajectories at a time, --concurrency requests in flight
    max_positions = None  # the server knows its own limit

    def __init__(self, spec: str, url: str, model: str, tok, *, concurrency: int = 8, timeout: float = 120.0,
                 retries: int = 4, prompt_ids: bool = True, backoff: float = 0.5):
        self.name, self.url, self.model, self.tokenizer = spec, url, model, tok
        self.concurrency, self.timeout, self.prompt_ids = max(1, concurrency), float(timeout), prompt_ids
        self.policy = retry.RetryPolicy(attempts=max(1, int(retries)), base=backoff, cap=max(8.0, backoff))
        self.eos = {i for i in (tok.eos_token_id,) if i is not None}
        self._key = os.environ.get("OPENAI_API_KEY") or None
        self._lock = threading.Lock()
        self.retokenized = 0
        self.generated_tokens = 0
        self.answered = 0  # requests the server answered with a completion
        self.dropped: set[str] = set()  # body fields the server refused, learned from its answers
        self.server_kind = ""  # "transformers" once the server has answered as `transformers serve`
        self._bos = _added_prefix(tok)

    def provenance(self) -> dict:
        out = {"engine": self.kind, "server": self.url, "prompt": "ids" if self.prompt_ids else "text",
               "tokens": "retokenized" if self.retokenized else "exact"}
        if self.server_kind:
            out["server_kind"] = self.server_kind
        return out

    def release(self, key: str) -> None:
        """Nothing to free here: prefix caching is the server's business (vLLM does it)."""

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        if not requests:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            results = list(pool.map(self._one, requests))
        if not self.answered and all(r.stop == "error" for r in results):
            # not one trajectory's problem: the server refuses everything (a wrong model name, an API it
            # does not speak); writing error rows and exiting 0 would hide it
            first = next(r.error for r in results if r.error)
            raise EngineError(self._redact(f"policy server {self.url} refused every request ({len(results)}), "
                                           f"none answered; its answer: {first}"))
        return results

    def complete(self, prompts: list[str], max_new_tokens: int = 256) -> list[str]:
        """Greedy replies to single-user-message prompts (the browse reader's interface)."""
        tok = self.tokenizer
        reqs = [GenRequest(tok(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                        add_generation_prompt=True),
                               add_special_tokens=False)["input_ids"], max_new_tokens, temperature=0.0)
                for p in prompts]
        return [tok.decode([i for i in r.ids if i not in self.eos], skip_special_tokens=True)
                if r.stop != "error" else "" for r in self.generate(reqs)]

    # --- one request ------------------------------------------------------------------------

    def body(self, req: GenRequest) -> dict:
        if self.prompt_ids:
            prompt = list(req.ids)
        else:  # the server tokenizes text with its special tokens: a BOS it adds itself is not sent twice
            ids = req.ids[len(self._bos):] if self._bos and req.ids[:len(self._bos)] == self._bos else req.ids
            prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
        body = {"model": self.model, "prompt": prompt,
                "max_tokens": int(req.max_new_tokens), "temperature": float(req.temperature),
                "top_p": float(req.top_p), "seed": int(req.seed) % (2**31 - 1), "n": 1, "stream": False,
                "logprobs": 1, **VLLM_FIELDS}
        if self.server_kind == TRANSFORMERS_KIND:
            # its sampling starts from the model's generation config (do_sample often unset: greedy, and
            # a top_k of its own); this samples from the plain distribution, as the in-process engine does
            body["generation_config"] = json.dumps({"do_sample": float(req.temperature) > 0, "top_k": 0})
        if req.stops:
            body["stop"] = list(req.stops)
        return {k: v for k, v in body.items() if k not in self.dropped}

    def _one(self, req: GenRequest) -> GenResult:
        if req.max_new_tokens <= 0:
            return GenResult(stop="length")
        while True:
            body = self.body(req)
            try:
                obj = self.policy.call(self._post, json.dumps(body).encode())
                res = self.parse(obj, req)
                break
            except retry.ToolFault as e:
                raise EngineError(self._redact(f"policy server {self.url} failed after {self.policy.attempts} "
                                               f"attempts: {e}")) from None
            except RequestError as e:
                if not self._learn(str(e), body):
                    return GenResult(stop="error", error=self._redact(str(e)))
        with self._lock:
            self.answered += 1
            self.generated_tokens += len(res.ids)
            self.retokenized += 0 if res.exact else 1
        return res

    def _learn(self, message: str, sent: dict) -> bool:
        """Adapt to a server's refusal of extension fields or of a token-id prompt. True when the request
        is worth sending again: the refused thing was in `sent` and is gone now (so each request is retried
        at most a few times: every retry sends strictly less)."""
        with self._lock:
            fields = refused_fields(message) - {"model", "prompt"}  # the request itself is never dropped
            if fields:
                self.server_kind = TRANSFORMERS_KIND
                self.dropped |= fields
                return bool(fields & sent.keys())
            if TEXT_PROMPT_ONLY in message and isinstance(sent.get("prompt"), list):
                self.prompt_ids = False
                return True
            return False

    def parse(self, obj, req: GenRequest) -> GenResult:
        """A `text_completion` response -> the sampled ids, their log-probs and why it stopped."""
        try:
            choice = obj["choices"][0]
            text = choice.get("text") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise RequestError(f"response is not a text completion: {str(obj)[:200]}") from None
        lp = choice.get("logprobs") or {}
        tokens = lp.get("tokens") if isinstance(lp, dict) else None
        values = lp.get("token_logprobs") if isinstance(lp, dict) else None
        exact = bool(tokens) and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens)
        if exact:
            ids = [int(t[len("token_id:"):]) for t in tokens]
        else:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        cut = None if exact else cut_at_stop(self.tokenizer, ids, req.stops)
        if cut is not None:  # the server ran past a stop string (it ignores `stop`, or merged tokens)
            ids, values = cut, None
        if isinstance(values, list) and len(values) == len(ids):
            logprobs = [float(v) if isinstance(v, (int, float)) else NAN for v in values]
        else:
            logprobs = [NAN] * len(ids)
        res = GenResult(ids, logprobs, exact=exact)
        finish = "stop" if cut is not None else choice.get("finish_reason")
        if finish == "length":
            res.stop = "length"
        elif ids and ids[-1] in self.eos:
            res.stop = "eos"
        elif any(s in self.tokenizer.decode(ids, skip_special_tokens=False) for s in req.stops):
            res.stop = "stop"  # (the ids may hold a stop string the server cut from the text)
        else:
            res.stop = "stop"
            hit = choice.get("stop_reason")
            if isinstance(hit, str) and hit in req.stops:
                # the server cut the stop string off the text: its tokens were sampled but not
                # returned, so add them re-tokenized (log-prob unknown)
                extra = self.tokenizer(hit, add_special_tokens=False)["input_ids"]
                res.ids += extra
                res.logprobs += [NAN] * len(extra)
                res.exact = False
            # else the server ended the turn at an end-of-sequence token it did not return:
            # the chat template's turn end is added as glue (mask 0)
        return res

    def _post(self, data: bytes) -> dict:
        raw = openai_http.post_json(self.url, data, key=self._key, timeout=self.timeout,
                                    max_bytes=MAX_RESPONSE_BYTES, what="policy server", permanent_error=RequestError)
        try:
            return json.loads(raw)
        except ValueError:
            raise RequestError(f"response is not JSON: {raw[:200]!r}") from None

    def _redact(self, text: str) -> str:
        return openai_http.redact(text, self._key)


def _added_prefix(tok) -> list[int]:
    """The ids a tokenizer puts before any text it tokenizes with its special tokens (a BOS), or []."""
    try:
        plain = tok("a", add_special_tokens=False)["input_ids"]
        full = tok("a", add_special_tokens=True)["input_ids"]
    except Exception:  # a tokenizer that cannot say: send the text as it is
        return []
    return list(full[:len(full) - len(plain)]) if full[len(full) - len(plain):] == plain else []


def cut_at_stop(tok, ids: list[int], stops) -> list[int] | None:
    """`ids` up to the first token whose text completes a stop string (the in-process engine's rule), or None
    when no stop string is complete before the last token."""
    stops = [s for s in stops if s]

    def done(k: int) -> bool:
        text = tok.decode(ids[:k], skip_special_tokens=False)
        return any(s in text for s in stops)
    if not stops or len(ids) < 2 or not done(len(ids) - 1):
        return None
    lo, hi = 1, len(ids) - 1  # `done` is monotone in k: the first k where it holds, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if done(mid) else (mid + 1, hi)
    return ids[:lo]
