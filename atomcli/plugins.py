"""Plugin registries for search backends and judges (built-ins register like third parties).

A SPEC string is `name` or `name:argument` (`local:INDEX`, `replay:CACHE`, `ddg`,
`heuristic`, `hf:MODEL`, `openai:BASE_URL#MODEL`). A backend factory is called as
`factory(argument, context, **options)` and returns an object following the protocol below.
Third-party packages register through the entry-point groups `atomcli.search` and
`atomcli.rewards.judges` (value: a factory). Unknown names fail before any data or model loads,
listing the valid names.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, Callable, Protocol

from atomcli.errors import unknown_choice


class SearchBackend(Protocol):
    """Raw search: raise `atomcli.retry.ToolFault` (transient) or return result dicts."""
    name: str

    def search(self, query: str, k: int) -> list[dict]:  # [{title, url, snippet}]
        ...


class Judge(Protocol):
    """One reply per prompt, in order: the text, or a `judges.JudgeError` returned in its place."""
    name: str

    def complete(self, prompts: list[str]) -> list:  # list[str | JudgeError]; see atomcli.rewards.judges
        ...


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


def split_spec(spec: str) -> tuple[str, str]:
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
    valid = set(SEARCH) | set(_BUILTIN_SEARCH) | {ep.name for ep in entry_points(group="atomcli.search")}
    if name not in valid:
        raise unknown_choice("search backend", name, valid)


def check_judge_spec(spec: str) -> None:
    name, _ = split_spec(spec)
    valid = set(JUDGES) | set(_BUILTIN_JUDGES) | {ep.name for ep in entry_points(group="atomcli.rewards.judges")}
    if name not in valid:
        raise unknown_choice("judge", name, valid)


def make_search(spec: str, context, **options):
    name, arg = split_spec(spec)
    return _lookup("search backend", name, SEARCH, _BUILTIN_SEARCH, "atomcli.search")(arg, context, **options)


def make_judge(spec: str, context, **options):
    name, arg = split_spec(spec)
    return _lookup("judge", name, JUDGES, _BUILTIN_JUDGES, "atomcli.rewards.judges")(arg, context, **options)
