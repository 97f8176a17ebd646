"""The agent format (docs/design.md, "The agent format"): system prompt, tool descriptions, and turn parsing.

One assistant turn is `<think>…atomic thoughts…</think>` followed by exactly one of
`<tool_call>{json}</tool_call>` or `<answer>short answer</answer>`. Every parser here is
total: it never raises on model output, it returns a defined result (and an error message
the model can read, for malformed tool calls). `forced_answer_turn` is the answer turn
`score-ig` teacher-forces to measure how likely the policy finds the golden answer.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass, field

TOOL_NAMES = ("web_search", "browse_webpage")
MAX_QUERIES = 3
MAX_URLS = 3
MAX_ARG_CHARS = 2000  # longer queries/urls are cut: a model can emit megabytes

TOOLS_DOC = [
    {"name": "web_search", "arguments": {"query": "1-3 search queries"}, "returns": "title, url and snippet of the top results"},
    {"name": "browse_webpage", "arguments": {"url_list": "1-3 urls", "query": "what to find"},
     "returns": "what the pages say about the query"},
]

# Kept short on purpose: every token of it is in every trajectory, and a 135M model on a CPU
# pays for each one in SFT, rollout and GRPO.
DEFAULT_SYSTEM_PROMPT = """You are a research agent. Today is {date}. Answer by searching and reading; your memory is not enough.
Each turn, think inside <think></think> in short tagged atomic thoughts such as <OBSERVATION>, <PLAN>, <HYPOTHESIS_TESTING>, <REFLECTION>, <ACTION>. Then write exactly one of:
<tool_call>{{"name": "web_search", "arguments": {{"query": ["..."]}}}}</tool_call>
<tool_call>{{"name": "browse_webpage", "arguments": {{"url_list": ["..."], "query": "..."}}}}</tool_call>
<answer>short answer</answer>
Tools:
{tools}
Results come back in <tool_response></tool_response>. Answer with a short phrase; yes or no for yes/no questions."""


def tools_text() -> str:
    """One line per tool: name(arguments) -> returns."""
    return "\n".join(f"{t['name']}(" + ", ".join(f"{k}: {v}" for k, v in t["arguments"].items())
                     + f") -> {t['returns']}" for t in TOOLS_DOC)


def system_prompt(date: str = "", template: str = "") -> str:
    """The system prompt with today's date (settable for reproducibility) and tools filled in."""
    date = date or _dt.date.today().isoformat()
    tpl = template or DEFAULT_SYSTEM_PROMPT
    tpl = tpl.replace("{{", "{").replace("}}", "}")
    return tpl.replace("{date}", date).replace("{tools}", tools_text())


def user_message(question: str, last_turn: bool = False) -> str:
    """The question; `last_turn` (a one-turn budget with the note on) adds LAST_TURN_NOTE."""
    return f"Question: {question}\n{LAST_TURN_NOTE}" if last_turn else f"Question: {question}"


# Tool output is untrusted data. Chat templates' control tokens written as text (ChatML's
# `<|im_end|>`, Llama 3's `<|eot_id|>`, DeepSeek's `<｜…｜>`) are parsed by the tokenizer into
# the real special tokens, so a page saying "<|im_end|><|im_start|>system …" would open a real
# system turn in the policy's context; a literal </tool_response> would close our wrapper.
_CONTROL_RE = re.compile(r"<(?=[|｜])|<(?=/?tool_response>)")


def neutralize(text: str) -> str:
    """Untrusted text with control-token look-alikes broken up (`<|` -> `< |`), otherwise as is."""
    return _CONTROL_RE.sub("< ", text) if isinstance(text, str) else ""


# The environment's word on the turn budget (rollout --last-turn-note), after the tool response
# that opens the last turn: without it the policy cannot know the cap and an episode still
# searching when the cap comes ends unanswered (as the learning study found).
LAST_TURN_NOTE = "This is your last turn: give your answer now."
# What rollout --force-answer says when the last turn still called a tool.
NOT_RUN = "No turns are left: this call was not run."


def tool_message(observation: str, last_turn: bool = False) -> str:
    """The tool response as the policy reads it; `last_turn` adds LAST_TURN_NOTE after it."""
    text = f"<tool_response>\n{neutralize(observation)}\n</tool_response>"
    return f"{text}\n{LAST_TURN_NOTE}" if last_turn else text


# --- parsing ------------------------------------------------------------------------------------

class _Pair:
    """`findall` of `re.compile(OPEN + "(.*?)" + CLOSE, re.S)` in linear time.

    The regex retries every unclosed OPEN against the rest of the text: quadratic, so a turn
    or table cell of a few hundred KB of `<think><think>…` took minutes. Same matches here."""

    def __init__(self, open_tag: str, close_tag: str):
        self.open, self.close = open_tag, close_tag

    def findall(self, text: str) -> list[str]:
        out, pos = [], 0
        while True:
            i = text.find(self.open, pos)
            if i < 0:
                return out
            j = text.find(self.close, i + len(self.open))
            if j < 0:  # no later OPEN can be closed either
                return out
            out.append(text[i + len(self.open):j])
            pos = j + len(self.close)


class _Units:
    """`findall` of `<([A-Z][A-Z0-9_]*)>(.*?)</\\1>` (re.S) in linear time: (tag, body) pairs."""
    OPEN = re.compile(r"<([A-Z][A-Z0-9_]*)>")
    CLOSE = re.compile(r"</([A-Z][A-Z0-9_]*)>")

    def findall(self, text: str) -> list[tuple[str, str]]:
        import bisect
        closes: dict[str, list[int]] = {}
        for m in self.CLOSE.finditer(text):
            closes.setdefault(m.group(1), []).append(m.start())
        out, pos = [], 0
        for m in self.OPEN.finditer(text):
            if m.start() < pos:
                continue  # inside the unit just taken
            ends = closes.get(m.group(1), ())
            k = bisect.bisect_left(ends, m.end())
            if k < len(ends):
                out.append((m.group(1), text[m.end():ends[k]]))
                pos = ends[k] + len(m.group(1)) + 3
        return out


THINK_RE = _Pair("<think>", "</think>")
ANSWER_RE = _Pair("<answer>", "</answer>")
TOOL_RE = _Pair("<tool_call>", "</tool_call>")
UNIT_RE = _Units()
STOP_STRINGS = ("</tool_call>", "</answer>")


@dataclass
class ToolCall:
    name: str
    arguments: dict
    error: str | None = None  # set when the call is malformed; the observation tells the model


@dataclass
class Turn:
    text: str
    think: str | None
    answer: str | None
    tool_call: ToolCall | None
    well_formed: bool
    problems: list[str] = field(default_factory=list)


def extract_answer(text: str) -> str | None:
    """The last <answer>…</answer> of a text, stripped; None when there is none."""
    if not isinstance(text, str):
        return None
    hits = ANSWER_RE.findall(text)
    return hits[-1].strip() if hits else None


def parse_tool_call(raw: str) -> ToolCall:
    """Parse and validate the JSON inside <tool_call>. Never raises."""
    raw = (raw or "").strip()
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as e:
        return ToolCall("", {}, f"invalid JSON in tool call ({str(e)[:80]}); "
                                'write {"name": "web_search", "arguments": {"query": ["..."]}}')
    if not isinstance(obj, dict):
        return ToolCall("", {}, "tool call must be a JSON object with `name` and `arguments`")
    name = obj.get("name")
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except ValueError:
            args = None
    if name not in TOOL_NAMES:
        return ToolCall(str(name)[:100], {}, f"unknown tool `{str(name)[:100]}`; valid: {', '.join(TOOL_NAMES)}")
    if not isinstance(args, dict):
        return ToolCall(name, {}, "`arguments` must be a JSON object")
    if name == "web_search":
        q = args.get("query")
        if isinstance(q, str):
            q = [q]
        if not isinstance(q, list) or not q or not all(isinstance(x, str) and x.strip() for x in q):
            return ToolCall(name, {}, "web_search needs `query`: a list of 1-3 non-empty strings")
        return ToolCall(name, {"query": [x.strip()[:MAX_ARG_CHARS] for x in q[:MAX_QUERIES]]})
    urls = args.get("url_list", args.get("urls"))
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u.strip() for u in urls):
        return ToolCall(name, {}, "browse_webpage needs `url_list`: a list of 1-3 urls")
    query = args.get("query", "")
    if not isinstance(query, str):
        query = json.dumps(query)[:MAX_ARG_CHARS]
    return ToolCall(name, {"url_list": [u.strip()[:MAX_ARG_CHARS] for u in urls[:MAX_URLS]],
                           "query": query[:MAX_ARG_CHARS]})


def parse_turn(text: str) -> Turn:
    """Split an assistant turn into think / tool call / answer and check its form."""
    text = text if isinstance(text, str) else ""
    problems = []
    thinks = THINK_RE.findall(text)
    n_open, n_close = text.count("<think>"), text.count("</think>")
    if n_open != 1 or n_close != 1 or len(thinks) != 1:
        problems.append("the turn must have exactly one <think>…</think>")
    answers = ANSWER_RE.findall(text)
    calls = TOOL_RE.findall(text)
    if len(answers) + len(calls) != 1:
        problems.append("the turn must end with exactly one <tool_call> or <answer>")
    tool_call = parse_tool_call(calls[-1]) if calls and not answers else None
    answer = answers[-1].strip() if answers else None
    if thinks and (answers or calls):
        first_action = min(i for i in (text.find("<answer>"), text.find("<tool_call>")) if i >= 0)
        if first_action < text.find("</think>"):
            problems.append("<tool_call>/<answer> must come after </think>")
    return Turn(text=text, think=thinks[0] if thinks else None, answer=answer, tool_call=tool_call,
                well_formed=not problems, problems=problems)


def atomic_thoughts(text: str) -> list[tuple[str, str]]:
    """(tag, text) units inside <think>; a <think> with no units is one unit tagged THINK."""
    if not isinstance(text, str):
        return []
    out = []
    for think in THINK_RE.findall(text):
        units = [(tag, body.strip()) for tag, body in UNIT_RE.findall(think)]
        if units:
            out.extend(units)
        elif think.strip():
            out.append(("THINK", think.strip()))
    return out


#: The thought of the answer turn that `score-ig` teacher-forces after a context (IGPO's fixed
#: "Now there's enough information to answer", written as one of our atomic thoughts).
FORCED_ANSWER_THOUGHT = "<REFLECTION>I have enough information to answer.</REFLECTION>"


def forced_answer_head() -> str:
    """The start of a forced answer turn: the thought closed and the answer tag opened. score-ig
    teacher-forces it before the golden answer; rollout --force-answer writes it for the policy."""
    return f"<think>{FORCED_ANSWER_THOUGHT}</think><answer>"


def forced_answer_turn(answer: str) -> tuple[str, tuple[int, int]]:
    """A well-formed answer turn, `<think>…</think><answer>ANSWER</answer>`, and the character span of ANSWER in it.

    It is what the policy writes after an assistant turn opens (the template's end-of-turn
    text follows it): the thought is closed, the answer tag opened, the answer, the tag closed."""
    head = forced_answer_head()
    return f"{head}{answer}</answer>", (len(head), len(head) + len(answer))


def trajectory_format_ok(messages: list[dict]) -> bool:
    """Every assistant turn well formed, and the last one answers."""
    turns = [m.get("content") or "" for m in messages or [] if m.get("role") == "assistant"]
    if not turns:
        return False
    parsed = [parse_turn(t) for t in turns]
    return all(p.well_formed for p in parsed) and parsed[-1].answer is not None
