"""Stage `score-rrm`: the Reasoning Reward Model scores every atomic thought (Atom-Searcher).

Owns `atomic_thoughts`, `atr`, `rrm_judge`, `rrm_error`. A judge failure is recorded in
`rrm_error` and `atr` stays null: it never silently becomes a score of 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class ScoreConfig:
    judge: str = opt("heuristic", "judge SPEC: heuristic, hf:MODEL (hf:smollm2), openai:BASE_URL#MODEL")
    retries: int = opt(3, "attempts per trajectory when the judge errs or its output does not parse")
    concurrency: int = opt(8, "parallel requests to an OpenAI-compatible judge")
    timeout: float = opt(120.0, "seconds per judge request")
    rate: float = opt(0.0, "judge calls per second (0 = unlimited)")
    api_key_env: str = opt("OPENAI_API_KEY", "environment variable holding the judge's API key")
    batch_size: int = opt(8, "prompts per batch for hf: judges")
    max_new_tokens: int = opt(256, "tokens the judge may write")


def run(table, config: ScoreConfig, context):
    raise NotBuiltError("`atom score-rrm` is not built yet")
