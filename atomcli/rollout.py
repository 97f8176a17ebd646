"""Stage `rollout`: the multi-turn atomic-thought agent (DESIGN.md §4), G samples per question.

Owns the rollout columns of the trajectory table, including the exact token columns
(`prompt_ids`, `completion_ids`, `loss_mask`, `old_logprobs`) built incrementally from what
the policy sampled and what the environment inserted.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomcli.config import opt
from atomcli.errors import NotBuiltError


@dataclass
class RolloutConfig:
    model: str = opt("smollm2", "policy: `smollm2`, a checkpoint folder, or openai:BASE_URL#MODEL")
    search: str = opt("ddg", "search backend SPEC: local:INDEX, ddg, replay:CACHE")
    group_size: int = opt(4, "samples per question (the GRPO group)")
    max_turns: int = opt(10, "assistant turns before the episode ends with finish_reason=max_turns")
    max_new_tokens: int = opt(512, "token cap per assistant turn")
    max_context: int = opt(8192, "token cap for the whole trajectory")
    temperature: float = opt(1.0, "sampling temperature (0 = greedy)")
    top_p: float = opt(1.0, "nucleus sampling")
    seed: int = opt(0, "random seed: same seed, same output")
    batch_size: int = opt(16, "trajectories advanced together in one batched generate")
    k: int = opt(10, "search results per query")
    cache: str = opt("", "SQLite cache file for searches and pages")
    replay: bool = opt(False, "serve tools only from --cache (a recorded environment)")
    reader: str = opt("bm25", "browse reader: bm25, policy, or a judge SPEC")
    allow_hosts: str = opt("", "comma-separated hosts/IPs the SSRF guard lets through (e.g. 127.0.0.1)")
    date: str = opt("", "date stated in the system prompt (YYYY-MM-DD; default today)")
    system_prompt: str = opt("", "system prompt text replacing the built-in one ({date} and {tools} are filled in)")
    limit: int = opt(0, "use only the first N questions (0 = all)")
    shard: str = opt("", "i/n: process every n-th group starting at i (split a question set across machines)")
    concurrency: int = opt(8, "parallel requests for the OpenAI engine and parallel tool calls")
    timeout: float = opt(120.0, "seconds per request for the OpenAI engine")
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run")


def run(table, config: RolloutConfig, context, *, done_groups=frozenset(), sink=None):
    raise NotBuiltError("`atom rollout` is not built yet")
