"""The agent's tools: `web_search` and `browse_webpage`, as the rollout executes them.

`ToolBox.run(call, memory_key)` turns one parsed tool call into the observation text the
model sees, and never raises: a tool that fails becomes an error observation (ok=False).
`run_many` runs the calls of one turn concurrently. The search backend comes from a SPEC
(atomcli.plugins); browsing reads local documents from the backend when it can, else the web.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from atomcli.agent_format import ToolCall


@dataclass
class ToolResult:
    observation: str
    ok: bool
    error: str | None = None
    cached: bool = False
    seconds: float = 0.0


def format_search(query: str, results: list[dict]) -> str:
    lines = [f'Results for "{query}":']
    if not results:
        lines.append("(no results)")
    for i, r in enumerate(results, 1):
        lines.append(f"{i}. {r.get('title', '')}\n   url: {r.get('url', '')}\n   {r.get('snippet', '')}")
    return "\n".join(lines)


class ToolBox:
    def __init__(self, search_spec: str, context, *, k: int = 10, cache: str = "", replay: bool = False,
                 reader: str = "bm25", allow_hosts: str = "", concurrency: int = 8, reader_fn=None):
        self.context, self.k = context, k
        self.backend = context.search(search_spec)
        self.pool = ThreadPoolExecutor(max_workers=max(1, concurrency))

    def run(self, call: ToolCall, memory_key: str = "") -> ToolResult:
        t0 = time.time()
        if call.error:
            return ToolResult(f"Error: {call.error}", False, call.error, seconds=time.time() - t0)
        try:
            if call.name == "web_search":
                parts = [format_search(q, self.backend.search(q, self.k)) for q in call.arguments["query"]]
                return ToolResult("\n\n".join(parts), True, seconds=time.time() - t0)
            parts = []
            for url in call.arguments["url_list"]:
                text = getattr(self.backend, "read_local", lambda u: None)(url)
                parts.append(f"Page {url}:\n" + (text if text is not None else "Error: cannot read this url"))
            return ToolResult("\n\n".join(parts), True, seconds=time.time() - t0)
        except Exception as e:  # a tool fault never ends the rollout
            msg = f"{call.name} failed: {type(e).__name__}: {e}"
            return ToolResult(f"Error: {msg}", False, msg, seconds=time.time() - t0)

    def run_many(self, items: list[tuple[ToolCall, str]]) -> list[ToolResult]:
        return list(self.pool.map(lambda it: self.run(*it), items))

    def close(self) -> None:
        self.pool.shutdown(wait=False)
