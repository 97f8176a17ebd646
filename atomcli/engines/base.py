"""What every policy engine is, takes and returns: the `Engine` protocol, one request per
trajectory turn, one result.

An engine (`engines.hf.HFEngine`, `engines.openai.OpenAIEngine`) is everything the rollout uses
of it, and nothing else: `generate(requests) -> results` one turn per request, `tokenizer` (the
chat template and token ids), `max_positions` (the model's context limit, or None when the engine
cannot know it), `release(key)` when a trajectory ends, `complete(prompts)` for the browse reader
`--reader policy`, and `provenance()` for the table's record. A new engine implements these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GenRequest:
    """One turn to sample: the full context so far and how to sample it."""
    ids: list[int]
    max_new_tokens: int
    seed: int = 0
    temperature: float = 1.0   # 0 = greedy
    top_p: float = 1.0
    stops: tuple[str, ...] = ()
    key: str | None = None      # a trajectory id: the engine may keep its KV for the next turn


@dataclass
class GenResult:
    """What was sampled. `stop`: "stop" (a stop string), "eos", "length" (token cap) or "error"."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop: str = "length"
    error: str | None = None
    exact: bool = True  # False: ids re-tokenized from text (an OpenAI server that hides ids)


class Engine(Protocol):
    """The policy engine a rollout samples from (see the module docstring)."""
    kind: str                  # "hf", "openai": recorded in the provenance
    name: str                  # the model spec it was made for
    tokenizer: Any             # a transformers tokenizer of the policy
    max_positions: int | None  # the model's context limit; None: the server knows its own
    pool_factor: int           # trajectories the rollout keeps going per row of --batch-size (HFEngine refills rows)

    def generate(self, requests: list[GenRequest]) -> list[GenResult]: ...

    def release(self, key: str) -> None: ...

    def complete(self, prompts: list[str], max_new_tokens: int = 256) -> list[str]: ...

    def provenance(self) -> dict: ...
