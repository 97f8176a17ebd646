"""Search backends for the real web: `ddg` (DuckDuckGo and friends through `ddgs`) and
`replay:CACHE` (the recorded environment: answers only from a cache file).

Backends are raw: they return `[{title, url, snippet}]` or raise `ToolFault` for transient
failures. Retries, rate limiting, caching and concurrency are the ToolBox's (atomcli.env.tools),
so every backend gets them the same way.
"""

from __future__ import annotations

import re

from atomcli.env.cache import Cache, normalize_query
from atomcli.errors import InputError
from atomcli.plugins import SearchTraits, register_search
from atomcli.retry import ToolFault

SAFESEARCH = ("on", "moderate", "off")


def _clean(text) -> str:
    return re.sub(r"\s+", " ", str(text or "")).strip()


class DDGSearch:
    """`ddgs` text search. `rate_limit` calls/s (burst 3: the 3 queries of one call go together)."""
    name = "ddg"

    def __init__(self, region: str = "us-en", safesearch: str = "moderate", rate: float = 2.0,
                 timeout: float = 10.0):
        if safesearch not in SAFESEARCH:
            raise InputError(f"unknown safesearch `{safesearch}`", hint="valid: " + ", ".join(SAFESEARCH))
        self.region, self.safesearch, self.timeout = region, safesearch, timeout
        # results differ by region and safe-search: they are different sources in the cache
        self.traits = SearchTraits(f"ddg/{region}/{safesearch}", rate_limit=rate, burst=3)

    def read_local(self, url: str) -> None:
        return None  # the web's pages are fetched, never held

    def search(self, query: str, k: int) -> list[dict]:
        from ddgs import DDGS
        from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException
        try:
            raw = DDGS(timeout=max(1, int(round(self.timeout)))).text(
                query, max_results=k, region=self.region, safesearch=self.safesearch)
        except (RatelimitException, TimeoutException) as e:
            raise ToolFault(f"ddg: {type(e).__name__}: {e}") from e
        except DDGSException as e:
            if "no results" in str(e).lower():
                return []
            # ddgs folds engine errors (blocked, network) into DDGSException: worth a retry
            raise ToolFault(f"ddg: {e}") from e
        out = []
        for r in raw or []:
            if not isinstance(r, dict):
                continue
            url = r.get("href") or r.get("url") or ""
            if url:
                out.append({"title": _clean(r.get("title")), "url": str(url).strip(), "snippet": _clean(r.get("body"))})
        return out[:k]


@register_search("ddg")
def make_ddg(arg: str, context, *, region: str | None = None, safesearch: str = "moderate", rate: float = 2.0,
             timeout: float = 10.0) -> DDGSearch:
    """`ddg` or `ddg:REGION` (e.g. ddg:de-de); options region, safesearch (on/moderate/off), rate, timeout."""
    return DDGSearch(region=region or arg or "us-en", safesearch=safesearch, rate=rate, timeout=timeout)


class NotRecorded(Exception):
    """A replayed tool call that the recorded run did not make."""


def covers(entry: dict | None, k: int) -> bool:
    """Whether a recorded search entry can answer top-`k`.

    An entry recorded with k' >= k serves k by truncation; one with fewer results than it
    asked for was the engine's whole answer and serves any k. Errors answer any k."""
    if entry is None:
        return False
    if "results" not in entry:
        return True
    recorded_k = entry.get("k", k)
    return recorded_k >= k or len(entry["results"]) < recorded_k


def recorded_search(cache: Cache, query: str, k: int, source: str | None) -> dict | None:
    """The newest recorded entry for `query` ({"results"} or {"error"}) that covers top-`k`."""
    entry = cache.get("search", normalize_query(query), source=source)
    return entry if covers(entry, k) else None


class ReplaySearch:
    """`replay:CACHE`: every search (and, in the ToolBox, every page) comes from the cache file;
    anything not recorded is an explicit "not recorded" error, never a network call."""
    name = "replay"

    def __init__(self, cache_path: str, source: str | None = None):
        self.cache_path, self.source = cache_path, source
        self.cache = Cache(cache_path, must_exist=True)
        self.traits = SearchTraits(source or "replay", replay_cache=cache_path, replay_source=source)

    def read_local(self, url: str) -> None:
        return None  # pages come from the replay cache (the ToolBox's replay mode)

    def search(self, query: str, k: int) -> list[dict]:
        entry = recorded_search(self.cache, query, k, self.source)
        if entry is None:
            raise NotRecorded(f'not recorded: no web_search for "{query}" in {self.cache_path}')
        if "error" in entry:
            raise RuntimeError(entry["error"])
        return entry["results"][:k]


@register_search("replay")
def make_replay(arg: str, context, *, source: str | None = None) -> ReplaySearch:
    """`replay:CACHE`; option `source` limits it to one recorded backend (e.g. ddg/us-en/moderate)."""
    if not arg:
        raise InputError("replay needs a cache file", hint="write replay:PATH_TO_CACHE")
    return ReplaySearch(arg, source)
