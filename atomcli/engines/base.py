"""What every policy engine takes and returns: one request per trajectory turn, one result.

An engine (`engines.hf.HFEngine`, `engines.openai.OpenAIEngine`) has
`generate(requests: list[GenRequest]) -> list[GenResult]`; the rollout needs nothing else,
so a new engine only has to speak these two types.
"""

from __future__ import annotations

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
    key: str | None = None      # a trajectory id: the engine may keep its KV for the next turn


@dataclass
class GenResult:
    """What was sampled. `stop`: "stop" (a stop string), "eos", "length" (token cap) or "error"."""
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stop: str = "length"
    error: str | None = None
    exact: bool = True  # False: ids re-tokenized from text (an OpenAI server that hides ids)
