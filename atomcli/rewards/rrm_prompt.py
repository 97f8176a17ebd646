"""The RRM prompt format: what a Reasoning Reward Model judge sees, and how its reply is read.

`trajectory_steps` turns a trajectory's messages into turns (thoughts, action, observation);
`render_prompt` writes the judge prompt; `parse_prompt` reads one back (the offline heuristic
judge scores from it); `parse_scores` reads the judge's JSON list of 0-10 scores. Used by the
`score-rrm` stage and by the judges, so a judge never imports a stage.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from atomcli.agent.format import TOOL_RE, atomic_thoughts, extract_answer

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
