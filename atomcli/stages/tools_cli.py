"""`atom search` and `atom browse`: print exactly what the agent would see.

Both build a `ToolBox` and a tool call the way the rollout does (the call goes through
`agent_format.parse_tool_call`, the same validation a model's call gets), run it, and print
on stdout the observation (text), or JSON Lines (json), for `jq` and scripts:

- search: one object per result, best first: `query`, `rank` (1 = best), `title`, `url`,
  `snippet`, `score` (the backend's relevance, higher is better; null when it gives none, as
  web search does), document `id` (null likewise), `cached`; a query that failed is one
  object `{query, error, cached}`;
- browse: one object per url: `url`, `status` (ok, nothing-new, no-text, error),
  `http_status` (pages fetched from the web), `source` (web or the local backend), `cached`,
  `error`, `text` (the page's readable text as extracted), `kept` (what the reader kept of it
  for `--query`: what the model would see), `page_chars`, `kept_chars`.

A failed call prints its error observation (or objects) too, then exits 1. Page and corpus
text is printed with its control characters made visible (`\x1b`, `\u202e`: atomcli.safety),
in both formats (JSON: as \\u escapes, so it still parses to the same text).
"""

from __future__ import annotations

import json

import typer

from atomcli.agent.format import parse_tool_call
from atomcli.env.tools import ToolBox, ToolResult
from atomcli.errors import InputError
from atomcli.safety import visible, visible_json

FORMATS = ("text", "json")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise InputError(f"unknown format `{fmt}`", hint="valid: " + ", ".join(FORMATS))


def json_lines(result: ToolResult, tool: str, head: dict) -> list[dict]:
    """The `--format json` objects of a web_search or browse_webpage result (see the module docstring)."""
    if result.data is None:  # the tool failed as a whole (no per-query or per-url details)
        return [{**head, "error": result.error, "cached": False}]
    if tool == "browse_webpage":
        return [dict(d) for d in result.data]
    out = []
    for d in result.data:
        if "error" in d:
            out.append({"query": d["query"], "error": d["error"], "cached": d["cached"]})
            continue
        for rank, r in enumerate(d["results"], 1):
            out.append({"query": d["query"], "rank": rank, "title": r.get("title", ""), "url": r.get("url", ""),
                        "snippet": r.get("snippet", ""), "score": r.get("score"), "id": r.get("id"),
                        "cached": d["cached"]})
    return out


def _emit(result: ToolResult, fmt: str, tool: str, **head) -> None:
    # page and corpus text is untrusted: its control characters are shown, never sent to the terminal raw
    if fmt == "json":
        for obj in json_lines(result, tool, head):
            typer.echo(visible_json(json.dumps(obj, ensure_ascii=False)))
    else:
        typer.echo(visible(result.observation))
    if not result.ok:
        raise typer.Exit(1)


def _run(toolbox: ToolBox, name: str, arguments: dict) -> ToolResult:
    call = parse_tool_call(json.dumps({"name": name, "arguments": arguments}))
    if call.error:
        toolbox.close()
        raise InputError(call.error)
    try:
        return toolbox.run(call, "cli")
    finally:
        toolbox.close()


def search(query: str, *, index: str | None, search: str | None, k: int, cache: str | None, replay: bool,
           fmt: str, context) -> None:
    _check_format(fmt)
    if index and search and search != f"local:{index}":
        raise InputError("give either --index or --search, not both")
    spec = search or (f"local:{index}" if index else "")
    if not spec:
        raise InputError("no search backend", hint="add --search SPEC (local:INDEX, ddg, replay:CACHE) or --index INDEX")
    if k < 1:
        raise InputError(f"-k must be at least 1 (got {k})")
    from atomcli import plugins
    plugins.check_search_spec(spec)
    toolbox = ToolBox(spec, context, k=k, cache=cache or "", replay=replay)
    _emit(_run(toolbox, "web_search", {"query": [query]}), fmt, "web_search", query=query)


def browse(url: str, *, query: str, search: str | None, cache: str | None, replay: bool, allow_hosts: str,
           reader: str, fmt: str, context) -> None:
    _check_format(fmt)
    if search:
        from atomcli import plugins
        plugins.check_search_spec(search)
    toolbox = ToolBox(search or "", context, cache=cache or "", replay=replay, reader=reader,
                      allow_hosts=allow_hosts)
    _emit(_run(toolbox, "browse_webpage", {"url_list": [url], "query": query}), fmt, "browse_webpage", url=url)
