"""The agent's tools: `web_search` and `browse_webpage`, as the rollout executes them.

`ToolBox.run(call, memory_key)` turns one parsed tool call into the observation text the
model sees, and never raises: a tool that fails becomes an error observation (ok=False).
`run_many` runs the calls of one turn concurrently. The search backend comes from a SPEC
(atomcli.plugins); browsing reads local documents from the backend when it can, else the web
(atomcli.env.fetch, behind the SSRF guard), then hands the page text to the reading agent
(atomcli.env.reader) with the question's short-term memory.

Around every network call: the cache (atomcli.env.cache) first, then the backend's rate limiter
and bounded retries (atomcli.retry). With `replay` (or the `replay:CACHE` spec) nothing
reaches the network: recorded results, including recorded errors, are served as they were,
so a replay produces byte-identical observations, and anything else is "not recorded".
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from atomcli.agent.format import ToolCall
from atomcli.env.cache import DEFAULT_TTL, Cache, normalize_query, normalize_url
from atomcli.env.fetch import Fetcher, FetchError, FetchLimits, Refused, page_text
from atomcli.env.reader import BM25Reader, LLMReader, Memory
from atomcli.env.search_web import NotRecorded, covers, recorded_search
from atomcli.errors import InputError
from atomcli.retry import RetryPolicy, ToolFault, limiter

NOTHING_NEW = "(nothing new: what this page says about the query was already returned)"
NO_TEXT = "(no readable text on this page)"
WEB_SOURCE = "web"
MAX_MEMORIES = 4096  # short-term memories kept (one per trajectory); the oldest are forgotten


@dataclass
class ToolResult:
    observation: str
    ok: bool
    error: str | None = None
    cached: bool = False
    seconds: float = 0.0
    data: list | None = None  # structured per-query / per-url details (for `--format json`)


def search_result(r: dict) -> dict:
    """One backend result as the tools keep it: title, url, snippet, and `score` (higher is better) and document
    `id` when the backend gives them (for `atom search --format json`; the model sees title, url and snippet)."""
    out = {"title": str(r.get("title", "")), "url": str(r.get("url", "")), "snippet": str(r.get("snippet", ""))}
    score = r.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
        out["score"] = float(score)
    if r.get("id") is not None:
        out["id"] = str(r["id"])
    return out


def format_search(query: str, results: list[dict]) -> str:
    lines = [f'Results for "{query}":']
    if not results:
        lines.append("(no results)")
    for i, r in enumerate(results, 1):
        lines.append(f"{i}. {r.get('title', '')}\n   url: {r.get('url', '')}\n   {r.get('snippet', '')}")
    return "\n".join(lines)


@dataclass
class _Outcome:
    """One query's results or one url's page text, or why not."""
    item: str
    value: object = None
    error: str | None = None
    cached: bool = False
    http_status: int | None = None  # a page fetched from the web: its HTTP status
    source: str | None = None       # a page: where its text came from (web, or the local backend's name)


def _describe(e: Exception) -> str:
    """Our own faults speak for themselves; anything else is named by its type."""
    msg = str(e) or type(e).__name__
    return msg if isinstance(e, (ToolFault, Refused, FetchError, NotRecorded)) else f"{type(e).__name__}: {msg}"


class ToolBox:
    """Executes tool calls. `reader`: bm25, policy (needs `reader_fn`), or a judge SPEC.

    `search_spec` "" means no search backend (browse only). `allow_hosts` opens hosts for the
    SSRF guard. `retry`, `limits`, `browse_rate` and `cache_ttl` tune faults, fetch caps and
    politeness; `search_options` are passed to the backend factory (e.g. region for ddg).
    """

    def __init__(self, search_spec: str, context, *, k: int = 10, cache: str = "", replay: bool = False,
                 reader: str = "bm25", allow_hosts: str = "", concurrency: int = 8,
                 reader_fn: Callable[[list[str]], list[str]] | None = None,
                 retry: RetryPolicy | None = None, limits: FetchLimits | None = None,
                 browse_rate: float | None = 10.0, cache_ttl: float = DEFAULT_TTL,
                 search_options: dict | None = None):
        self.context, self.k = context, k
        self.reader_spec = reader
        self._reader = self._make_reader_if_cheap(reader, reader_fn, context)  # bad names fail first
        self.backend = context.search(search_spec, **(search_options or {})) if search_spec else None
        traits = self.backend.traits if self.backend else None
        self.replay = bool(replay or (traits and traits.replay_cache))
        if traits and traits.replay_cache:
            if cache and cache != traits.replay_cache:
                raise InputError(f"`{search_spec}` and --cache {cache} name different files", hint="give one of them")
            cache = traits.replay_cache
            self.replay_source = traits.replay_source
        else:
            self.replay_source = traits.cache_name if traits else None
        if self.replay and not cache:
            raise InputError("replay needs a recorded cache", hint="add --cache FILE or use --search replay:FILE")
        self.cache = Cache(cache, ttl=cache_ttl, must_exist=self.replay) if cache else None
        self.fetcher = Fetcher(allow_hosts, limits)
        self.retry = retry or RetryPolicy()
        self._search_limiter = limiter(self.backend.name, traits.rate_limit, traits.burst) if self.backend else None
        self._browse_limiter = limiter(WEB_SOURCE, browse_rate, 3)
        self._memories: OrderedDict[str, Memory] = OrderedDict()
        self._lock = threading.Lock()
        n = max(1, concurrency)
        self.pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="toolbox")
        # queries/urls of one call fan out here; a separate pool so run_many cannot deadlock
        self._fanout = ThreadPoolExecutor(max_workers=3 * n, thread_name_prefix="toolbox-io")

    # --- readers -------------------------------------------------------------------------------

    @staticmethod
    def _make_reader_if_cheap(spec: str, reader_fn, context):
        if spec == "bm25":
            return BM25Reader()
        if spec == "policy":
            if reader_fn is None:
                raise InputError("reader `policy` needs the policy model, which only `atom rollout` has",
                                 hint="use --reader bm25 or a judge SPEC (hf:MODEL, openai:URL#MODEL)")
            return LLMReader(reader_fn, "policy")
        from atomcli import plugins
        plugins.check_judge_spec(spec)  # fail now on a bad name; load the judge at first use
        if plugins.split_spec(spec)[0] == "heuristic":
            raise InputError("judge `heuristic` only scores atomic thoughts; it cannot read pages",
                             hint="use --reader bm25, policy, or a model judge (hf:MODEL, openai:URL#MODEL)")
        return None

    def _get_reader(self):
        with self._lock:
            if self._reader is None:
                judge = self.context.judge(self.reader_spec)
                self._reader = LLMReader(judge.complete, self.reader_spec)
            return self._reader

    def memory(self, key: str) -> Memory:
        with self._lock:
            mem = self._memories.pop(key, None) or Memory()
            self._memories[key] = mem
            while len(self._memories) > MAX_MEMORIES:
                self._memories.popitem(last=False)
            return mem

    def forget(self, memory_key: str) -> None:
        """Drop a question's short-term memory (when its trajectory is finished)."""
        with self._lock:
            self._memories.pop(memory_key, None)

    # --- calls ---------------------------------------------------------------------------------

    def run(self, call: ToolCall, memory_key: str = "") -> ToolResult:
        t0 = time.time()
        try:
            if call.error:
                result = ToolResult(f"Error: {call.error}", False, call.error)
            elif call.name == "web_search":
                result = self._web_search(list(call.arguments["query"]))
            elif call.name == "browse_webpage":
                result = self._browse(list(call.arguments["url_list"]), call.arguments.get("query", ""), memory_key)
            else:
                result = ToolResult(f"Error: unknown tool `{call.name}`", False, f"unknown tool `{call.name}`")
        except Exception as e:  # a tool fault never ends the rollout
            msg = f"{call.name} failed: {_describe(e)}"
            result = ToolResult(f"Error: {msg}", False, msg)
        result.seconds = time.time() - t0
        return result

    def run_many(self, items: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        return list(self.pool.map(lambda it: self.run(*it), items))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self._fanout.shutdown(wait=False)
        if self.cache is not None:
            self.cache.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- web_search ----------------------------------------------------------------------------

    def _web_search(self, queries: list[str]) -> ToolResult:
        if self.backend is None:
            raise InputError("no search backend configured")
        outcomes = list(self._fanout.map(self._search_one, queries))
        parts, errors, data = [], [], []
        for o in outcomes:
            if o.error is None:
                parts.append(format_search(o.item, o.value))
                data.append({"query": o.item, "results": o.value, "cached": o.cached})
            else:
                parts.append(f'Results for "{o.item}":\nError: {o.error}')
                errors.append(f'"{o.item}": {o.error}')
                data.append({"query": o.item, "error": o.error, "cached": o.cached})
        return ToolResult("\n\n".join(parts), not errors, "; ".join(errors) or None,
                          cached=all(o.cached for o in outcomes), data=data)

    def _search_one(self, query: str) -> _Outcome:
        key, source = normalize_query(query), self.backend.traits.cache_name
        if self.replay:
            entry = recorded_search(self.cache, query, self.k, self.replay_source)
            if entry is None:
                return _Outcome(query, error="not recorded: no web_search for this query in the replay cache")
            if "error" in entry:
                return _Outcome(query, error=entry["error"], cached=True)
            return _Outcome(query, entry["results"][: self.k], cached=True)
        if self.cache is not None:
            entry = self.cache.get_fresh("search", key, source)
            if covers(entry, self.k):
                return _Outcome(query, entry["results"][: self.k], cached=True)
        try:
            results = self.retry.call(self._search_live, query)
        except Exception as e:
            err = _describe(e)
            if self.cache is not None:
                self.cache.put("search", key, source, {"k": self.k, "error": err}, ok=False)
            return _Outcome(query, error=err)
        results = [search_result(r) for r in results][: self.k]
        if self.cache is not None:
            self.cache.put("search", key, source, {"k": self.k, "results": results})
        return _Outcome(query, results)

    def _search_live(self, query: str) -> list[dict]:
        if self._search_limiter is not None:
            self._search_limiter.acquire()
        return self.backend.search(query, self.k)

    # --- browse_webpage ------------------------------------------------------------------------

    def _browse(self, urls: list[str], query: str, memory_key: str) -> ToolResult:
        pages = list(self._fanout.map(self._page_one, urls))
        readable = [p for p in pages if p.error is None and p.value]
        mem = self.memory(memory_key)
        extracted: dict[int, str] = {}
        if readable:
            reader = self._get_reader()
            with mem.lock:  # one reader at a time per question keeps "only new" well defined
                texts = self.retry.call(reader.read_pages, [(p.item, p.value) for p in readable], query, mem)
            extracted = {id(p): t for p, t in zip(readable, texts)}
        parts, errors, data = [], [], []
        for p in pages:
            kept = extracted.get(id(p), "")
            if p.error is not None:
                body, status = f"Error: {p.error}", "error"
                errors.append(f"{p.item}: {p.error}")
            elif not p.value:
                body, status = NO_TEXT, "no-text"
            else:
                body, status = kept or NOTHING_NEW, "ok" if kept else "nothing-new"
            parts.append(f"Page {p.item}:\n{body}")
            # text: the page's readable text as extracted; kept: what the reader returned of it for the query
            data.append({"url": p.item, "status": status, "http_status": p.http_status, "source": p.source,
                         "cached": p.cached, "error": p.error, "text": p.value if p.error is None else None,
                         "kept": kept if p.error is None else None, "page_chars": len(p.value or ""),
                         "kept_chars": len(kept)})
        return ToolResult("\n\n".join(parts), not errors, "; ".join(errors) or None,
                          cached=all(p.cached for p in pages), data=data)

    def _page_one(self, url: str) -> _Outcome:
        """The text of one page: replay cache, live cache, local document, or the web."""
        key = normalize_url(url)
        if self.replay:
            entry = self.cache.get("page", key)
            if entry is None:
                return _Outcome(url, error="not recorded: this url was not browsed in the recorded run")
            return _Outcome(url, entry.get("text"), entry.get("error"), cached=True)
        read_local = self.backend.read_local if self.backend is not None and self.backend.traits.local_documents else None
        local_source = self.backend.traits.cache_name if self.backend is not None else "local"
        if self.cache is not None:
            for source in ((local_source, WEB_SOURCE) if read_local else (WEB_SOURCE,)):
                entry = self.cache.get_fresh("page", key, source)
                if entry is not None:
                    return _Outcome(url, entry["text"], cached=True, source=source)
        source, http_status = WEB_SOURCE, None
        try:
            text = read_local(url) if read_local is not None else None
            if text is not None:
                source = local_source
            else:
                # one deadline for the url, retries included: a worker never waits past it
                deadline = time.monotonic() + self.fetcher.limits.total_timeout
                resp = self.retry.call_by(deadline, self._fetch_live, url, deadline)
                http_status = resp.status
                text = page_text(resp)
        except Exception as e:
            err = _describe(e)
            if self.cache is not None:
                self.cache.put("page", key, source, {"error": err}, ok=False)
            return _Outcome(url, error=err, http_status=http_status, source=source)
        if self.cache is not None:
            self.cache.put("page", key, source, {"text": text})
        return _Outcome(url, text, http_status=http_status, source=source)

    def _fetch_live(self, url: str, deadline: float | None = None):
        if self._browse_limiter is not None:
            self._browse_limiter.acquire()
        return self.fetcher.get(url, deadline=deadline)
