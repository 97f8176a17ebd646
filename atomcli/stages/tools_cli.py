"""`atom search` and `atom browse`: print exactly what the agent would see.

Both build a `ToolBox` and a tool call the way the rollout does (the call goes through
`agent_format.parse_tool_call`, the same validation a model's call gets), run it, and print
the observation on stdout (text), or the observation with its details (json). A failed call
prints its error observation too, then exits 1. Page and corpus text is printed with its
control characters made visible (`\x1b`, `\u202e`: atomcli.safety), in both formats.
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


def _emit(result: ToolResult, fmt: str, **head) -> None:
    # page and corpus text is untrusted: its control characters are shown, never sent to the terminal raw
    if fmt == "json":
        typer.echo(visible_json(json.dumps({**head, "observation": result.observation, "ok": result.ok,
                                            "error": result.error, "cached": result.cached,
                                            "seconds": round(result.seconds, 3), "details": result.data},
                                           ensure_ascii=False)))
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
    _emit(_run(toolbox, "web_search", {"query": [query]}), fmt, tool="web_search", query=query, search=spec)


def browse(url: str, *, query: str, search: str | None, cache: str | None, replay: bool, allow_hosts: str,
           reader: str, fmt: str, context) -> None:
    _check_format(fmt)
    if search:
        from atomcli import plugins
        plugins.check_search_spec(search)
    toolbox = ToolBox(search or "", context, cache=cache or "", replay=replay, reader=reader,
                      allow_hosts=allow_hosts)
    _emit(_run(toolbox, "browse_webpage", {"url_list": [url], "query": query}), fmt,
          tool="browse_webpage", url=url, query=query)
