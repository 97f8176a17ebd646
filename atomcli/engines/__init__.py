"""Policy engines: the in-process HF engine (with its KV cache), OpenAI-compatible servers, and how a
served policy is kept up to date with the trainer (policy_sync)."""
