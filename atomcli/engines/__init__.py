"""Policy engines: the in-process HF engine (with its KV cache) and OpenAI-compatible servers."""
