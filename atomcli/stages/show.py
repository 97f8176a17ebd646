"""`atom show`: trajectories rendered for a person to read (terminal or one HTML page).

Per row: the question and golden answers; per assistant turn its atomic thoughts coloured by
their RRM score (red low, green high; from `atomic_thoughts` when score-rrm ran), the tool
call or the answer, and each tool response (truncated); then the answer, finish_reason,
format_ok, tool errors and the rewards (f1, em, atr, alpha, reward, advantage) present.

Where it goes: the terminal rendering is printed to **stdout**, because for this command
the rendering is the requested output (`atom show t.parquet | less -R`), like `cat`; with
`--html FILE` the page is the output, nothing is printed and only the "wrote" line goes to
stderr (`--html -` prints the page). Model text is untrusted: the terminal view never
interprets it as rich markup and shows its control characters as escapes (`\x1b`;
atomcli.safety.visible), and the HTML page escapes all of it, control characters included,
so `--html -` on a terminal is as safe as the terminal view (inline CSS, no scripts, no
external assets).

Scores are shown as stored; colours use score/10 (score-rrm's integer 0-10 scale), unless
every score in the table is a fraction in [0, 1] (a third-party scorer's scale).
"""

from __future__ import annotations

import html as _html
import json
import sys
from collections import defaultdict, deque
from pathlib import Path

from atomcli import safety, tableio
from atomcli.agent import format as agent_format
from atomcli.errors import InputError

TERMINAL_OBS_CHARS = 500
HTML_OBS_CHARS = 6000
REWARD_COLUMNS = ("f1", "em", "atr", "alpha", "reward", "advantage", "format_penalty")
STAT_COLUMNS = ("finish_reason", "format_ok", "n_turns", "n_search", "n_browse", "rrm_judge", "rrm_error")


def main(table_path: str, *, row: int | None = None, html: str | None = None, context=None) -> None:
    name = "<stdin>" if table_path == "-" else table_path
    safety.check_output(html, inputs=[table_path], flag="--html")  # the page never replaces the table
    table = tableio.read_table(table_path)
    if table.num_rows == 0:
        raise InputError("table is empty", file=name, hint="nothing to show")
    if row is not None and not 0 <= row < table.num_rows:
        raise InputError(f"row {row} does not exist (the table has {table.num_rows} rows)", file=name,
                         hint=f"--row takes 0 to {table.num_rows - 1}")
    records = table.slice(row, 1).to_pylist() if row is not None else table.to_pylist()
    first = row or 0
    scale = _score_scale(records)
    views = [trajectory_view(rec, first + i, scale) for i, rec in enumerate(records)]
    if html:
        page = to_html(views, title=f"atom show {name}").encode()
        if html == "-":
            sys.stdout.buffer.write(page)
            sys.stdout.buffer.flush()
        else:
            tableio.write_bytes_atomic(Path(html), page)
            if context is not None:
                context.log(f"[green]wrote[/] {html}")
        return
    # model, page and corpus text: escape sequences (colours, OSC 52 clipboard writes, titles) shown, not run
    print_views(safety.visible_tree(views), safety.console(file=sys.stdout, highlight=False))


# --- a neutral view of one row (both renderings read only this) --------------------------------

def trajectory_view(rec: dict, index: int, scale: float = 1.0) -> dict:
    scored = _scored_thoughts(rec.get("atomic_thoughts"))
    messages = rec.get("messages") or []
    question = rec.get("question")
    turns, n_assistant, skipped_question = [], 0, False
    for m in messages:
        role, content = m.get("role"), m.get("content") or ""
        if role == "system":
            continue
        if role == "user" and not skipped_question:
            skipped_question = True  # the question, shown in the header
            question = question or content
            continue
        if role == "assistant":
            n_assistant += 1
            turns.append(_assistant_view(n_assistant, content, scored, scale))
        else:
            turns.append({"kind": "message", "role": role or "?", "text": content})
    leftover = [(tag, text, s, _unit(s, scale)) for (tag, text), q in scored.items() for s in q]
    return {
        "index": index,
        "traj_id": rec.get("traj_id"), "id": rec.get("id"), "data_source": rec.get("data_source"),
        "policy": rec.get("policy"), "question": question, "golden": rec.get("golden_answers") or [],
        "turns": turns, "unmatched_thoughts": leftover,
        "answer": rec.get("answer"), "has_answer": "answer" in rec,
        "stats": {k: rec[k] for k in STAT_COLUMNS if rec.get(k) is not None},
        "rewards": {k: rec[k] for k in REWARD_COLUMNS if rec.get(k) is not None},
        "tool_errors": [f"turn {c.get('turn')} {c.get('name')}: {c.get('error')}"
                        for c in rec.get("tool_calls") or [] if c and c.get("error")],
    }


def _assistant_view(n: int, text: str, scored: dict, scale: float) -> dict:
    parsed = agent_format.parse_turn(text)
    thoughts = []
    for tag, body in agent_format.atomic_thoughts(text):
        queue = scored.get((tag, body))
        score = queue.popleft() if queue else None
        thoughts.append((tag, body, score, _unit(score, scale)))
    calls = agent_format.TOOL_RE.findall(text)
    tool_call = _pretty_json(calls[-1]) if calls else None
    return {"kind": "assistant", "turn": n, "thoughts": thoughts, "tool_call": tool_call,
            "answer": parsed.answer, "problems": parsed.problems,
            # a turn with none of the structure would otherwise show nothing at all
            "raw": text if not thoughts and tool_call is None and parsed.answer is None else None}


def _scored_thoughts(items) -> dict:
    """(tag, text) -> queue of scores, in order; matched to the messages by content because
    the table's `turn` numbering is score-rrm's business, not ours."""
    out: dict = defaultdict(deque)
    for t in items or []:
        if t and t.get("score") is not None:
            out[(t.get("tag"), (t.get("text") or "").strip())].append(float(t["score"]))
    return out


def _score_scale(records: list[dict]) -> float:
    """10 (score-rrm's integer 0-10 scale), unless every score is a fraction in [0, 1]."""
    scores = [t["score"] for r in records for t in (r.get("atomic_thoughts") or []) if t and t.get("score") is not None]
    fractional = bool(scores) and all(0 <= s <= 1 for s in scores) and any(s != int(s) for s in scores)
    return 1.0 if fractional else 10.0


def _unit(score, scale: float) -> float | None:
    return None if score is None else min(1.0, max(0.0, score / scale))


def _pretty_json(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except (ValueError, RecursionError):
        return raw.strip()


def _truncate(text: str, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[:limit] + f" … ({len(text) - limit} more chars)"


def _num(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _rgb(u: float) -> tuple[int, int, int]:
    """red (0) -> amber (0.5) -> green (1)."""
    lo, mid, hi = (205, 45, 45), (200, 150, 0), (40, 160, 60)
    a, b, t = (lo, mid, u * 2) if u < 0.5 else (mid, hi, u * 2 - 1)
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


# --- terminal ---------------------------------------------------------------------------------

def print_views(views: list[dict], console) -> None:
    """Everything from the table goes through rich Text, never markup: model text stays text."""
    from rich.rule import Rule
    from rich.text import Text

    for v in views:
        head = f"row {v['index']}" + "".join(f"  {k} {v[k]}" for k in ("traj_id", "id", "data_source", "policy")
                                              if v.get(k) is not None)
        console.print(Rule(Text(head, style="bold")))
        console.print(Text.assemble(("question: ", "bold"), str(v["question"] or "-")))
        console.print(Text.assemble(("golden:   ", "bold"), " | ".join(v["golden"]) or "-"))
        for t in v["turns"]:
            if t["kind"] == "assistant":
                console.print(Text(f"turn {t['turn']}", style="bold cyan"))
                for tag, body, score, u in t["thoughts"]:
                    style = "dim" if u is None else "rgb({},{},{})".format(*_rgb(u))
                    label = f"  <{tag}>" + (f" {score:g}" if score is not None else "") + " "
                    console.print(Text.assemble((label, style + " bold"), (body, style)))
                if t["tool_call"]:
                    console.print(Text.assemble(("  → tool_call ", "bold magenta"), t["tool_call"]))
                if t["answer"] is not None:
                    console.print(Text.assemble(("  → answer ", "bold green"), t["answer"]))
                if t["raw"]:
                    console.print(Text.assemble(("  raw: ", "bold"), _truncate(t["raw"], TERMINAL_OBS_CHARS)))
                if t["problems"]:
                    console.print(Text("  format: " + "; ".join(t["problems"]), style="red"))
            else:
                console.print(Text.assemble((f"  ← {t['role']}: ", "bold blue"),
                                            (_truncate(t["text"], TERMINAL_OBS_CHARS), "dim")))
        for tag, body, score, u in v["unmatched_thoughts"]:
            console.print(Text(f"  (scored, not found in messages) <{tag}> {score:g} {body}", style="dim"))
        if v["has_answer"]:
            console.print(Text.assemble(("answer: ", "bold"), (str(v["answer"]) if v["answer"] is not None
                                                                else "(none)", "bold green")))
        for err in v["tool_errors"]:
            console.print(Text("tool error: " + err, style="red"))
        facts = {**v["stats"], **v["rewards"]}
        if facts:
            console.print(Text("  ".join(f"{k}={_num(x)}" for k, x in facts.items()), style="bold"))
        console.print()


# --- HTML -------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222;line-height:1.4}
section{border:1px solid #ccc;border-radius:6px;padding:1rem;margin:1.5rem 0}
h2{font-size:1.05rem;margin:0 0 .5rem} .meta{color:#666;font-size:.85rem}
.turn{margin:.8rem 0;padding-left:.6rem;border-left:3px solid #9ab}
.thought{margin:.25rem 0;padding:.2rem .4rem;border-left:5px solid #bbb;background:#f4f4f4;white-space:pre-wrap}
.tag{font-weight:bold;font-family:monospace}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7fa;padding:.4rem;margin:.3rem 0}
.answer{font-weight:bold;color:#1b6e2a} .problem,.err{color:#b00}
table.facts{border-collapse:collapse;margin-top:.5rem} table.facts td{border:1px solid #ddd;padding:.15rem .5rem}
.legend span{padding:0 .5rem;margin-right:.2rem}
"""


def _e(x) -> str:
    """Table text for the page: control characters shown as escapes (a page printed with `--html -`
    reaches a terminal; no valid HTML holds them anyway), then HTML-escaped."""
    return _html.escape(safety.visible("" if x is None else str(x)), quote=True)


def _thought_html(tag, body, score, u) -> str:
    style = ""
    if u is not None:
        r, g, b = _rgb(u)
        style = f' style="border-left-color:rgb({r},{g},{b});background:rgba({r},{g},{b},0.12)"'
    label = _e(f"<{tag}>") + (f" {_e(f'{score:g}')}" if score is not None else "")
    return f'<div class="thought"{style}><span class="tag">{label}</span> {_e(body)}</div>'


def _view_html(v: dict) -> str:
    meta = " · ".join(f"{k} {_e(v[k])}" for k in ("traj_id", "id", "data_source", "policy") if v.get(k) is not None)
    out = [f"<section><h2>row {v['index']}</h2><div class=\"meta\">{meta}</div>",
           f"<p><b>Question:</b> {_e(v['question'] or '-')}</p>",
           f"<p><b>Golden answers:</b> {_e(' | '.join(v['golden']) or '-')}</p>"]
    for t in v["turns"]:
        if t["kind"] == "assistant":
            out.append(f'<div class="turn"><div><b>turn {t["turn"]}</b></div>')
            out += [_thought_html(*th) for th in t["thoughts"]]
            if t["tool_call"]:
                out.append(f"<div><b>tool_call</b><pre>{_e(t['tool_call'])}</pre></div>")
            if t["answer"] is not None:
                out.append(f'<div>answer: <span class="answer">{_e(t["answer"])}</span></div>')
            if t["raw"]:
                out.append(f"<pre>{_e(_truncate(t['raw'], HTML_OBS_CHARS))}</pre>")
            if t["problems"]:
                out.append(f'<div class="problem">format: {_e("; ".join(t["problems"]))}</div>')
            out.append("</div>")
        else:
            out.append(f"<details><summary>{_e(t['role'])} ({len(t['text'])} chars)</summary>"
                       f"<pre>{_e(_truncate(t['text'], HTML_OBS_CHARS))}</pre></details>")
    if v["unmatched_thoughts"]:
        out.append("<div class=\"meta\">scored thoughts not found in the messages:</div>")
        out += [_thought_html(*th) for th in v["unmatched_thoughts"]]
    if v["has_answer"]:
        shown = v["answer"] if v["answer"] is not None else "(none)"
        out.append(f'<p><b>Answer:</b> <span class="answer">{_e(shown)}</span></p>')
    out += [f'<div class="err">tool error: {_e(err)}</div>' for err in v["tool_errors"]]
    facts = {**v["stats"], **v["rewards"]}
    if facts:
        out.append('<table class="facts">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(_num(x))}</td></tr>"
                                                    for k, x in facts.items()) + "</table>")
    out.append("</section>")
    return "\n".join(out)


def to_html(views: list[dict], title: str = "atom show") -> str:
    legend = "".join('<span style="background:rgba({},{},{},0.25)">{}</span>'.format(*_rgb(u), f"{u:.1f}")
                     for u in (0.0, 0.25, 0.5, 0.75, 1.0))
    # the CSP forbids scripts and any fetch even if something slipped past escaping
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><div class=\"legend\">atomic-thought score (scaled to 0-1): {legend}</div>\n"
            + "\n".join(_view_html(v) for v in views) + "\n</body></html>\n")
