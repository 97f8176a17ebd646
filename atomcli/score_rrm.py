"""Stage `score-rrm`: the Reasoning Reward Model scores every atomic thought (Atom-Searcher).

Owns `atomic_thoughts`, `atr`, `rrm_judge`, `rrm_error`, and the RRM prompt format.

For each trajectory the atomic thoughts of every assistant turn are extracted
(`agent_format.atomic_thoughts`; a `<think>` with no tagged units is one unit tagged THINK)
and numbered across the whole trajectory. The judge sees the question, each turn's numbered
thoughts, the action it took and the observation that came back — never the golden answer —
and is asked for a JSON list of integer scores 0-10, one per thought (is it correct, grounded
in what was observed so far, useful for the next step). `atr` = mean score / 10, in [0, 1].

Failure is never a score: when the judge errs (after its own transport retries) or its reply
does not parse after `retries` attempts (a JSON list possibly inside prose or code fences; a
list of the wrong length or with a score outside 0-10 counts as unparseable), the row gets
`rrm_error` set, `atr` null and every thought's `score` null; `aggregate-reward` then falls
back to the outcome reward for that row. Unparseable replies are retried with a reminder
appended to the prompt, so that a greedy judge does not just repeat itself.

A trajectory with no atomic thoughts at all (no `<think>`, or only empty ones) is not sent to
the judge: there is no reasoning to reward, so `atr` = 0.0 with `rrm_error` null. That is a
legitimate score, not a failure.

All prompts go to the judge in one `complete` call: concurrency and batching are the judge's.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass

from rich.markup import escape

from atomcli import schema
from atomcli.agent_format import TOOL_RE, atomic_thoughts, extract_answer
from atomcli.config import opt
from atomcli.errors import InputError


@dataclass
class ScoreConfig:
    judge: str = opt("heuristic", "judge SPEC: heuristic, hf:MODEL (hf:smollm2), openai:BASE_URL#MODEL")
    retries: int = opt(3, "attempts per trajectory when the judge's reply does not parse (transport faults are "
                          "retried this many times inside the openai judge)")
    concurrency: int = opt(8, "parallel requests to an OpenAI-compatible judge")
    timeout: float = opt(120.0, "seconds per judge request")
    rate: float = opt(0.0, "judge calls per second (0 = unlimited)")
    backoff: float = opt(1.0, "seconds before the first retry of a failed judge request (doubles each time)")
    api_key_env: str = opt("OPENAI_API_KEY", "environment variable holding the judge's API key")
    batch_size: int = opt(8, "prompts per batch for hf: judges")
    max_new_tokens: int = opt(256, "tokens the judge may write")
    obs_chars: int = opt(1500, "characters of each observation shown to the judge; longer ones are cut (0 = all)")


# --- what the judge sees -----------------------------------------------------------------------

@dataclass
class Step:
    """One assistant turn as the judge sees it."""
    thoughts: list[tuple[str, str]]  # (tag, text)
    action: str                       # the tool call JSON, `answer: ...`, or `(none)`
    observation: str | None           # what came back before the next turn, if anything


def trajectory_steps(messages: list[dict] | None) -> list[Step]:
    """Assistant turns with their thoughts, action and following observation.

    Everything after the first assistant turn that is not an assistant turn (tool messages,
    or user messages for chat templates without a tool role) is the observation of the turn
    before it. The system prompt and the question before the first turn are not observations.
    """
    steps: list[Step] = []
    for m in messages or []:
        role, content = (m or {}).get("role"), (m or {}).get("content") or ""
        if role == "assistant":
            steps.append(Step(atomic_thoughts(content), _action(content), None))
        elif steps and role != "system":
            obs = _strip_tool_response(content)
            prev = steps[-1].observation
            steps[-1].observation = obs if prev is None else prev + "\n" + obs
    return steps


def _action(text: str) -> str:
    answer = extract_answer(text)
    if answer is not None:
        return f"answer: {answer}"
    calls = TOOL_RE.findall(text)
    return calls[-1].strip()[:1000] if calls else "(none)"


def _strip_tool_response(text: str) -> str:
    t = text.strip()
    if t.startswith("<tool_response>") and t.endswith("</tool_response>"):
        t = t[len("<tool_response>"):-len("</tool_response>")].strip()
    return t


INSTRUCTIONS = """You are a reasoning reward model. An AI research agent answered the question below with two tools, web_search and browse_webpage. Its reasoning is split into numbered atomic thoughts, each tagged with its kind. After each turn you see the action it took and the result that came back.

Score every thought from 0 to 10: 10 = correct, grounded in what the agent had observed when it wrote it, and useful for the next step; 0 = wrong, made up, or useless. Judge each thought only by the question and what the agent had seen at that point."""

# The example is not valid JSON on purpose: a judge that echoes it must not be read as scoring.
TASK = ("There are {n} thoughts. Reply with only a JSON list of {n} integers from 0 to 10, one per thought, "
        "in order: [score of thought 1, score of thought 2, ...].")
RETRY_REMINDER = ("\n\nYour previous reply could not be read. Reply with only a JSON list of exactly {n} "
                  "integers from 0 to 10, nothing else.")
_INDENT = "    "
# Thought headers carry no brackets: a judge that echoes "[1]" must not look like it scored.
_THOUGHT_RE = re.compile(r"THOUGHT \d+ \((.*)\)")


def _block(text: str) -> list[str]:
    # Content is indented so that no line of it can pass for a section header (parse_prompt).
    return [_INDENT + line for line in text.split("\n")]


def render_prompt(question: str, steps: list[Step], obs_chars: int = 1500) -> str:
    """The judge prompt: instructions, question, turns with numbered thoughts, task."""
    lines = [INSTRUCTIONS, "", "### QUESTION", *_block(question or ""), ""]
    n = 0
    for k, step in enumerate(steps, 1):
        lines.append(f"### TURN {k}")
        for tag, text in step.thoughts:
            n += 1
            lines += [f"THOUGHT {n} ({tag})", *_block(text)]
        lines += ["ACTION", *_block(step.action)]
        if step.observation is not None:
            obs = step.observation
            if obs_chars > 0 and len(obs) > obs_chars:
                obs = obs[:obs_chars] + " …[cut]"
            lines += ["RESULT", *_block(obs)]
        lines.append("")
    lines += ["### TASK", TASK.format(n=n)]
    return "\n".join(lines)


def parse_prompt(prompt: str) -> tuple[str, list[Step]] | None:
    """Read a `render_prompt` prompt back (the heuristic judge works from it); None if not one.

    Content lines are indented, headers are not, so thought text can never pass for a header."""
    if not isinstance(prompt, str) or "\n### QUESTION\n" not in prompt:
        return None
    question: list[str] = []
    drafts: list[dict] = []  # per turn: thoughts [(tag, lines)], action lines, result lines
    target: list[str] | None = question
    for line in prompt.split("\n### QUESTION\n", 1)[1].split("\n"):
        if line.startswith(_INDENT):
            if target is None:
                return None
            target.append(line[len(_INDENT):])
            continue
        target = None
        if line == "":
            continue
        if line == "### TASK":
            break
        if line.startswith("### TURN "):
            drafts.append({"thoughts": [], "action": [], "result": None})
        elif not drafts:
            return None
        elif _THOUGHT_RE.fullmatch(line):
            target = []
            drafts[-1]["thoughts"].append((_THOUGHT_RE.fullmatch(line).group(1), target))
        elif line == "ACTION":
            target = drafts[-1]["action"] = []
        elif line == "RESULT":
            target = drafts[-1]["result"] = []
        else:
            return None
    else:
        return None  # no ### TASK: not one of ours, or cut short
    steps = [Step([(tag, "\n".join(body)) for tag, body in d["thoughts"]], "\n".join(d["action"]),
                  None if d["result"] is None else "\n".join(d["result"])) for d in drafts]
    return "\n".join(question), steps


# --- reading the judge's reply -----------------------------------------------------------------

_FLAT_LIST_RE = re.compile(r"\[[^\[\]]*\]")


def parse_scores(reply, n: int) -> list[float] | None:
    """The scores in a judge reply, or None when it does not parse.

    Takes the last JSON list of numbers with exactly `n` items found anywhere in the reply
    (prose and ```json fences around it are fine, as is a list inside an object). Every score
    must be a finite number in [0, 10] (7.0 and 7.5 are accepted; true/"7" are not).
    """
    if not isinstance(reply, str) or n <= 0:
        return None
    found = None
    # A list of numbers has no brackets inside, so the candidates are the flat [...] spans: one
    # linear scan. (Decoding from every "[" was quadratic: a garbage reply of 1 MB took minutes.)
    for m in _FLAT_LIST_RE.finditer(reply):
        try:
            obj = json.loads(m.group())
        except ValueError:
            continue
        if isinstance(obj, list) and len(obj) == n and all(_is_number(x) for x in obj):
            found = obj
    if found is None or not all(0 <= x <= 10 for x in found):
        return None
    return [float(x) for x in found]


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# --- the stage ---------------------------------------------------------------------------------

def judge_options(config: ScoreConfig) -> dict:
    """Everything a judge factory may use; each judge ignores what it does not."""
    return {"concurrency": config.concurrency, "timeout": config.timeout, "rate": config.rate,
            "retries": config.retries, "backoff": config.backoff, "api_key_env": config.api_key_env,
            "batch_size": config.batch_size, "max_new_tokens": config.max_new_tokens}


def _validate(config: ScoreConfig) -> None:
    checks = [("retries", config.retries >= 1), ("concurrency", config.concurrency >= 1),
              ("timeout", config.timeout > 0), ("rate", config.rate >= 0), ("backoff", config.backoff >= 0),
              ("batch_size", config.batch_size >= 1), ("max_new_tokens", config.max_new_tokens >= 1),
              ("obs_chars", config.obs_chars >= 0)]
    for name, ok in checks:
        if not ok:
            raise InputError(f"option --{name.replace('_', '-')} is out of range ({getattr(config, name)!r})",
                             hint="retries, concurrency, batch sizes and token counts >= 1; timeout > 0")


def score(judge, prompts: dict[int, str], counts: dict[int, int], retries: int
          ) -> tuple[dict[int, list[float]], dict[int, str]]:
    """Ask the judge for every prompt at once; re-ask only the unparseable ones.

    Returns (scores by row, errors by row); every row of `prompts` is in exactly one."""
    scores: dict[int, list[float]] = {}
    errors: dict[int, str] = {}
    pending = list(prompts)
    for attempt in range(1, retries + 1):
        if not pending:
            break
        asked = [prompts[i] + (RETRY_REMINDER.format(n=counts[i]) if attempt > 1 else "") for i in pending]
        try:
            replies = list(judge.complete(asked))
            if len(replies) != len(asked):
                raise RuntimeError(f"judge returned {len(replies)} replies for {len(asked)} prompts")
        except Exception as e:  # a misbehaving (third-party) judge loses these rows, never the run
            replies = [e] * len(asked)
        retry_rows = []
        for i, reply in zip(pending, replies):
            if not isinstance(reply, str):
                # the judge already retried its transient faults: do not multiply them here
                errors[i] = f"judge error: {type(reply).__name__}: {reply}"[:500]
                continue
            parsed = parse_scores(reply, counts[i])
            if parsed is not None:
                scores[i] = parsed
                errors.pop(i, None)
            else:
                errors[i] = (f"unparseable judge reply after {attempt} attempt(s), expected a JSON list of "
                             f"{counts[i]} scores 0-10: {reply[:200]!r}")
                retry_rows.append(i)
        pending = retry_rows
    return scores, errors


CHUNK = 1024  # trajectories in flight at once: bounds memory on 100k-row tables, keeps a judge server busy


def run(table, config: ScoreConfig, context):
    _validate(config)
    t0 = time.time()
    judge = context.judge(config.judge, **judge_options(config))  # fails before any work
    context.log(f"score-rrm: {table.num_rows} trajectories -> judge {escape(judge.name)}")
    thoughts_col, atr_col, err_col, counts = [], [], [], {}
    # Chunk by chunk: the messages of 100k trajectories as Python objects, with their rendered
    # prompts, would take ~3 GB on top of the table.
    for start in range(0, table.num_rows, CHUNK):
        part = table.slice(start, CHUNK)
        questions = part.column("question").to_pylist()
        all_steps = [trajectory_steps(m) for m in part.column("messages").to_pylist()]
        n = {i: sum(len(s.thoughts) for s in steps) for i, steps in enumerate(all_steps)}
        prompts = {i: render_prompt(questions[i], steps, config.obs_chars)
                   for i, steps in enumerate(all_steps) if n[i]}
        scores, errors = score(judge, prompts, n, config.retries)
        for i, steps in enumerate(all_steps):
            counts[start + i] = n[i]
            thoughts, atr, err = _row_columns(steps, scores.get(i), errors.get(i))
            thoughts_col.append(thoughts)
            atr_col.append(atr)
            err_col.append(err)
    _summary(context, judge.name, atr_col, err_col, counts, time.time() - t0)
    return schema.set_columns(table, {"atomic_thoughts": thoughts_col, "atr": atr_col,
                                      "rrm_judge": [judge.name] * table.num_rows, "rrm_error": err_col})


def _row_columns(steps, row_scores: list[float] | None, error: str | None):
    """(atomic_thoughts, atr, rrm_error) of one trajectory."""
    units = [(turn, tag, text) for turn, step in enumerate(steps) for tag, text in step.thoughts]
    thoughts = [{"turn": turn, "tag": tag, "text": text, "score": row_scores[j] if row_scores else None}
                for j, (turn, tag, text) in enumerate(units)]
    if not units:
        return thoughts, 0.0, None  # nothing to reward: a legitimate 0, not a failure
    if row_scores is not None:
        return thoughts, sum(row_scores) / len(row_scores) / 10, None
    return thoughts, None, error or "judge gave no reply"


def _summary(context, name: str, atr: list, errors: list, counts: dict, seconds: float) -> None:
    scored = [a for a, e in zip(atr, errors) if a is not None]
    n_err = sum(e is not None for e in errors)
    empty = sum(1 for c in counts.values() if c == 0)
    mean = sum(scored) / len(scored) if scored else float("nan")
    color = "yellow" if n_err else "green"
    context.log(f"[{color}]score-rrm[/] judge {escape(name)}: {len(atr)} trajectories, "
                f"{sum(counts.values())} atomic thoughts, mean ATR {mean:.3f}, "
                f"judge errors {n_err}, no thoughts {empty}, {seconds:.1f} s")
    first = next((e for e in errors if e), None)
    if first:
        context.log(f"[yellow]first judge error:[/] {escape(first[:300])}")
