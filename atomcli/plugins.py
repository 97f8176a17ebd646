"""Plugin registries for search backends and judges (built-ins register like third parties).

A SPEC string is `name` or `name:argument` (`local:INDEX`, `replay:CACHE`, `ddg`,
`heuristic`, `hf:MODEL`, `openai:BASE_URL#MODEL`). A backend factory is called as
`factory(argument, context, **options)` and returns an object following the protocol below.
Third-party packages register through the entry-point groups `atomcli.search` and
`atomcli.judges` (value: a factory). Unknown names fail before any data or model loads,
listing the valid names.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from atomcli.errors import unknown_choice


@dataclass(frozen=True)
class SearchTraits:
    """What the ToolBox needs to know about a search backend besides `search` (defaults in one place).

    cache_name:    the source its results and pages are cached under (e.g. `ddg/us-en/moderate`)
    rate_limit:    calls per second the ToolBox allows it (None = no limit), with `burst`
    replay_cache:  set for a recorded environment (`replay:CACHE`): the ToolBox then answers every
                   search and page from this cache file only (replay is a mode of the cache)
    replay_source: with replay_cache, only entries recorded from this backend (None = any)
    local_documents: its `read_local` serves the pages of the urls it returns (a local index)
    """
    cache_name: str
    rate_limit: float | None = None
    burst: int = 1
    replay_cache: str | None = None
    replay_source: str | None = None
    local_documents: bool = False


class SearchBackend(Protocol):
    """Raw search: raise `atomcli.retry.ToolFault` (transient) or return result dicts.

    Retries, rate limiting, caching, replay and concurrency are the ToolBox's: a backend only
    declares its `traits` and, when it holds documents itself, serves them from `read_local`."""
    name: str
    traits: SearchTraits

    def search(self, query: str, k: int) -> list[dict]:  # [{title, url, snippet}]
        ...

    def read_local(self, url: str) -> str | None:  # the page text of a url it returned; None = fetch it
        ...


class Judge(Protocol):
    """One reply per prompt, in order: the text, or a `judges.JudgeError` returned in its place.

    `complete` may also take a keyword `progress`, a function it calls with the number of replies
    just finished (from any thread), so that long scoring runs show progress; see judge_complete."""
    name: str

    def complete(self, prompts: list[str]) -> list:  # list[str | JudgeError]; see atomcli.rewards.judges
        ...


def judge_complete(judge, prompts: list[str], progress: Callable[[int], None] | None = None) -> list:
    """`judge.complete(prompts)`, reporting finished replies to `progress` as they come when the judge
    takes the `progress` keyword, else all at once when it returns."""
    if progress is None:
        return judge.complete(prompts)
    try:
        takes = "progress" in inspect.signature(judge.complete).parameters
    except (TypeError, ValueError):
        takes = False
    if takes:
        return judge.complete(prompts, progress=progress)
    replies = judge.complete(prompts)
    progress(len(prompts))
    return replies


SEARCH_GROUP, JUDGE_GROUP = "atomcli.search", "atomcli.judges"  # entry-point groups of third-party plugins
SEARCH: dict[str, Callable[..., Any]] = {}
JUDGES: dict[str, Callable[..., Any]] = {}

# module paths of built-ins; imported lazily so that `--help` stays cheap
_BUILTIN_SEARCH = {"local": "atomcli.env.search_local", "ddg": "atomcli.env.search_web", "replay": "atomcli.env.search_web"}
_BUILTIN_JUDGES = {"heuristic": "atomcli.rewards.judges", "hf": "atomcli.rewards.judges", "openai": "atomcli.rewards.judges"}


def register_search(name: str):
    def deco(factory):
        SEARCH[name] = factory
        return factory
    return deco


def register_judge(name: str):
    def deco(factory):
        JUDGES[name] = factory
        return factory
    return deco


def parse_options(text: str) -> dict:
    """`region=de-de,rate=1.5,verbose=true` -> {"region": "de-de", "rate": 1.5, "verbose": True}: the
    options a search backend's factory takes (`--search-options`)."""
    from atomcli.errors import InputError
    out: dict = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise InputError(f"search option `{item}` is not KEY=VALUE", hint="e.g. --search-options region=de-de,rate=1")
        v: Any = val.strip()
        if v.lower() in ("true", "false"):
            v = v.lower() == "true"
        else:
            for cast in (int, float):
                try:
                    v = cast(v)
                    break
                except ValueError:
                    pass
        out[key.strip().replace("-", "_")] = v
    return out


def split_spec(spec: str) -> tuple[str, str]:
    from atomcli.safety import check_no_secret
    check_no_secret(spec, "SPEC")  # keys come from the environment, never from a SPEC that gets stored
    name, _, arg = spec.partition(":")
    return name.strip(), arg.strip()


def _lookup(kind: str, name: str, registry: dict, builtins: dict, group: str):
    if name in registry:
        return registry[name]
    if name in builtins:
        importlib.import_module(builtins[name])
        if name in registry:
            return registry[name]
    for ep in entry_points(group=group):
        if ep.name == name:
            registry[name] = ep.load()
            return registry[name]
    valid = set(registry) | set(builtins) | {ep.name for ep in entry_points(group=group)}
    raise unknown_choice(kind, name, valid)


def check_search_spec(spec: str) -> None:
    """Validate the name part early (before data or models load)."""
    name, _ = split_spec(spec)
    valid = set(SEARCH) | set(_BUILTIN_SEARCH) | {ep.name for ep in entry_points(group=SEARCH_GROUP)}
    if name not in valid:
        raise unknown_choice("search backend", name, valid)


def check_judge_spec(spec: str) -> None:
    name, _ = split_spec(spec)
    valid = set(JUDGES) | set(_BUILTIN_JUDGES) | {ep.name for ep in entry_points(group=JUDGE_GROUP)}
    if name not in valid:
        raise unknown_choice("judge", name, valid)


def make_search(spec: str, context, **options):
    name, arg = split_spec(spec)
    backend = _lookup("search backend", name, SEARCH, _BUILTIN_SEARCH, SEARCH_GROUP)(arg, context, **options)
    missing = [m for m in ("name", "traits", "search", "read_local") if not hasattr(backend, m)]
    if missing or not isinstance(backend.traits, SearchTraits):
        from atomcli.errors import InputError
        raise InputError(f"search backend `{name}` does not implement atomcli.plugins.SearchBackend "
                         f"(missing: {', '.join(missing) or 'traits: SearchTraits'})",
                         hint="declare name, traits = SearchTraits(...), search(query, k) and read_local(url)")
    return backend


def make_judge(spec: str, context, **options):
    name, arg = split_spec(spec)
    return _lookup("judge", name, JUDGES, _BUILTIN_JUDGES, JUDGE_GROUP)(arg, context, **options)
