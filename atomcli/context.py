"""The run context handed to every stage: logging to stderr, seeds, and shared resources.

Stages never open paths or read argv; what they need from outside (a model, a search
backend, a judge) they ask the context for. The context caches what it loads, which is how
`run-all` loads the policy, the index and the judge once for the whole loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.console import Console

from atomcli import safety
from atomcli.home import atom_home

if TYPE_CHECKING:
    from atomcli.train.resident import ResidentPolicy


@dataclass
class Context:
    # every string it prints (logs, tables of table text) shows control characters as escapes
    console: Console = field(default_factory=lambda: safety.console(stderr=True, highlight=False))
    quiet: bool = False
    home: Path = field(default_factory=atom_home)
    _cache: dict = field(default_factory=dict, repr=False)
    # run-all's in-memory policy (atomcli.train.resident): the model of the checkpoint it stands for,
    # saved or not, and what grpo-step continues from; None outside run-all
    resident: "ResidentPolicy | None" = field(default=None, repr=False)

    def log(self, msg: str) -> None:
        """Human-readable progress; stderr only (stdout carries data)."""
        if not self.quiet:
            from atomcli.safety import visible
            self.console.print(visible(msg))  # messages may quote a page or a model: no live escapes

    def log_first_error(self, what: str, errors) -> None:
        """The first of a stage's recorded per-row errors, so a log shows what went wrong."""
        first = next((e for e in errors if e), None)
        if first:
            from rich.markup import escape
            self.log(f"[yellow]first {what} error:[/] {escape(first[:300])}")

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """Load something once per context (models, indexes, judges)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def forget(self, key: Any) -> None:
        self._cache.pop(key, None)

    def forget_models(self) -> None:
        """Drop cached policies (run-all does this when a new checkpoint replaces the old one)."""
        for key in [k for k in self._cache if isinstance(k, tuple) and k and k[0] == "model"]:
            del self._cache[key]

    # Convenience accessors; the heavy lifting lives in the modules named.
    def model(self, spec: str, **kw):
        """(model, tokenizer) for a model spec; see atomcli.models. The resident policy answers for
        the checkpoint it stands for (its module, on the trainer's device; a copy in `dtype=` when asked)."""
        if self.resident is not None and self.resident.stands_for(spec):
            return self.resident.sampler(kw.get("dtype", "float32"))
        from atomcli import models
        return self.cached(("model", spec, tuple(sorted(kw.items()))), lambda: models.load(spec, self, **kw))

    def search(self, spec: str, **kw):
        """A search backend for a SPEC string; see atomcli.plugins."""
        from atomcli import plugins
        return self.cached(_search_key(spec, kw), lambda: plugins.make_search(spec, self, **kw))

    def forget_search(self, spec: str, **kw) -> None:
        """Drop the backend `search(spec, **kw)` cached (its index is about to move or be deleted)."""
        self.forget(_search_key(spec, kw))

    def judge(self, spec: str, **kw):
        """A judge for a SPEC string; see atomcli.plugins."""
        from atomcli import plugins
        return self.cached(("judge", spec, tuple(sorted(kw.items()))), lambda: plugins.make_judge(spec, self, **kw))


def _search_key(spec: str, options: dict) -> tuple:
    """What a search backend is cached under: its SPEC and its options."""
    return ("search", spec, tuple(sorted(options.items())))
