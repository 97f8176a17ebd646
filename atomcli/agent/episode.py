"""One agent episode and its token bookkeeping (docs/design.md: the trajectory table, the agent format).

`Chat` renders conversations with the policy's chat template and measures the glue text
between renderings; `Episode` holds one trajectory's messages and exact token columns;
`Agent` drives episodes turn by turn: it builds the engine request, absorbs the sampled ids
(mask 1, with their log-probs), and appends what the environment inserts (mask 0);
`turn_spans` reads the turns back from a `loss_mask`. The rollout stage batches many
episodes through an engine and the tools; everything here is plain data and a tokenizer,
so it is tested without a model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from atomcli.agent import format as agent_format
from atomcli.engines.base import GenRequest
from atomcli.errors import InputError


def turn_seed(seed: int, traj_id: str, turn: int) -> int:
    """A trajectory's own seed for one turn: independent of batching, resume and sharding."""
    h = hashlib.sha256(f"{seed}\x00{traj_id}\x00{turn}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)



def turn_spans(loss_mask) -> list[tuple[int, int]]:
    """[start, end) of every run of 1s in a `loss_mask`: the tokens one assistant turn sampled.

    Turns are separated by what the environment inserted (mask 0: the end-of-turn glue, the
    tool response, the next turn's opening), so run k is assistant turn k. This is how
    `score-ig` finds where a turn ends and how `grpo-step` gives each token its turn's advantage."""
    spans, start = [], None
    for j, m in enumerate(loss_mask):
        if m and start is None:
            start = j
        elif not m and start is not None:
            spans.append((start, j))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


# --- chat-template arithmetic ---------------------------------------------------------------

class TemplateError(Exception):
    """The chat template re-rendered an earlier part of the conversation differently."""


class Chat:
    """Renders conversations with the policy's chat template and measures glue between them."""

    def __init__(self, tok):
        self.tok = tok
        if not getattr(tok, "chat_template", None):
            raise InputError("the policy's tokenizer has no chat template",
                             hint="use an instruct/chat model (its tokenizer_config.json or chat_template.jinja)")

    def render(self, messages: list[dict], open_turn: bool = False) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=open_turn)

    def encode(self, text: str) -> list[int]:
        # the template text already holds any BOS it wants; never let the tokenizer add one
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def extend(self, before: str, messages: list[dict], open_turn: bool = False) -> tuple[str, str]:
        """(rendering of `messages`, the text it adds after `before`); TemplateError if not a prefix."""
        after = self.render(messages, open_turn)
        if not after.startswith(before):
            raise TemplateError("the chat template does not extend the previous rendering")
        return after, after[len(before):]

    def check(self, system: str) -> None:
        """Refuse templates that are not append-only, before any sampling is spent."""
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Question: probe?"}]
        turn = ('<think><PLAN>probe</PLAN></think><tool_call>{"name": "web_search", '
                '"arguments": {"query": ["probe"]}}</tool_call>')
        try:
            text = self.render(msgs, open_turn=True)
            for m in ({"role": "assistant", "content": turn},
                      {"role": "tool", "content": agent_format.tool_message("probe result")}):
                base = text if m["role"] == "tool" else text + m["content"]
                msgs = msgs + [m]
                text, _ = self.extend(base, msgs)
            self.extend(text, msgs, open_turn=True)
        except TemplateError:
            raise InputError("the policy's chat template re-renders earlier turns (not append-only), so "
                             "exact token columns cannot match the rendered messages",
                             hint="use a model whose template only appends (ChatML, Qwen2.5, Llama 3)") from None
        except Exception as e:  # e.g. a template that has no system or tool role
            raise InputError(f"the policy's chat template cannot render an agent conversation ({e})",
                             hint="the template must accept system, user, assistant and tool messages") from None


# --- one trajectory -------------------------------------------------------------------------

@dataclass
class Episode:
    row: int
    group_id: str
    sample_idx: int
    messages: list[dict] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    old_logprobs: list[float] = field(default_factory=list)
    text: str = ""  # what prompt_ids + completion_ids decode to
    n_turns: int = 0
    tool_calls: list[dict] = field(default_factory=list)
    answer: str | None = None
    finish_reason: str | None = None
    error: str | None = None  # why an `error` episode ended (logged; there is no column for it)
    pending: object = None  # the ToolCall waiting for its observation
    reopen: tuple | None = None  # (tokens, text) before the last turn opening, to undo it on error
    head: str = ""  # text the environment wrote at the start of the open assistant turn (a forced answer's)

    @property
    def traj_id(self) -> str:
        return f"{self.group_id}/{self.sample_idx}"

    @property
    def n_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def add(self, ids: list[int], mask: int, logprobs: list[float] | None = None) -> None:
        self.completion_ids += ids
        self.loss_mask += [mask] * len(ids)
        self.old_logprobs += logprobs if logprobs is not None else [0.0] * len(ids)

    def finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.pending = None


# Finish reasons that are a budget running out, not a choice of the policy: the turn cap, and the
# context cap (no room for the turn, or for another one). aggregate-reward --truncated mask/fail reads them.
MAX_TURNS = "max_turns"
LENGTH = "length"
TRUNCATED = (MAX_TURNS, LENGTH)
# An answer the environment asked for after the last turn still called a tool (rollout --force-answer):
# scored like any answer, counted apart.
FORCED_ANSWER = "forced_answer"

NO_ACTION = ("the turn ended without <tool_call>…</tool_call> or <answer>…</answer>; think inside "
             "<think></think>, then call one tool or give the answer")


@dataclass
class Sampling:
    """How the agent samples its turns (the rollout stage fills it from its config)."""
    max_new_tokens: int
    max_turns: int
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    last_turn_note: bool = False  # tell the policy, before its last turn, that it must answer
    force_answer: bool = False    # a last turn that still calls a tool is followed by a forced answer turn

    def is_last(self, turn: int) -> bool:
        """Whether the note goes before turn `turn` (1-based): the cap's turn, with the note on."""
        return self.last_turn_note and turn == self.max_turns


class Agent:
    """Drives episodes turn by turn: builds requests, absorbs samples, adds observations."""

    def __init__(self, sampling: Sampling, chat: Chat, system: str, max_context: int):
        self.cfg, self.chat, self.system, self.max_context = sampling, chat, system, max_context
        self.template_faults = 0

    def start(self, ep: Episode, question: str) -> None:
        ep.messages = [{"role": "system", "content": self.system},
                       {"role": "user", "content": agent_format.user_message(question, self.cfg.is_last(1))}]
        ep.text = self.chat.render(ep.messages, open_turn=True)
        ep.prompt_ids = self.chat.encode(ep.text)
        if ep.n_tokens >= self.max_context:
            ep.finish(LENGTH)

    def request(self, ep: Episode):
        budget = min(self.cfg.max_new_tokens, self.max_context - ep.n_tokens)
        return GenRequest(ep.prompt_ids + ep.completion_ids, budget,
                          seed=turn_seed(self.cfg.seed, ep.traj_id, ep.n_turns),
                          temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                          stops=agent_format.STOP_STRINGS, key=ep.traj_id)

    def absorb(self, ep: Episode, res, budget: int) -> None:
        """Append one sampled turn; decide whether it ends the episode or needs an observation."""
        if res.stop == "error":
            if ep.reopen is not None:  # end on the tool message, as `length` does, not on an open turn
                n, ep.text = ep.reopen
                del ep.completion_ids[n:], ep.loss_mask[n:], ep.old_logprobs[n:]
            ep.error = res.error
            ep.finish("error")
            return
        before = ep.text[:len(ep.text) - len(ep.head)]  # the turn's content starts with a forced head
        ep.add(res.ids, 1, res.logprobs)
        ep.n_turns += 1
        full = self.chat.decode(ep.prompt_ids + ep.completion_ids)
        seg = full[len(before):] if full.startswith(before) else ep.head + self.chat.decode(res.ids)
        sampled_text = before + seg
        # content = the text of the sampled ids, minus an end-of-turn token the template writes
        contents = [seg]
        if res.stop == "eos" and res.ids:
            eos_text = self.chat.decode(res.ids[-1:])
            if eos_text and seg.endswith(eos_text):
                contents.insert(0, seg[:-len(eos_text)])
        for content in contents:
            msgs = ep.messages + [{"role": "assistant", "content": content}]
            try:
                closed, _ = self.chat.extend(sampled_text, msgs)
                break
            except TemplateError:
                continue
        else:
            self.template_faults += 1
            ep.messages = msgs
            ep.text = sampled_text
            ep.finish("error")
            return
        ep.messages, ep.text = msgs, sampled_text
        turn = agent_format.parse_turn(content)
        if turn.answer is not None:
            ep.answer = turn.answer
            return self._close(ep, closed, FORCED_ANSWER if ep.head else "answer")
        if res.stop == "length" and budget < self.cfg.max_new_tokens:
            return self._close(ep, closed, LENGTH)  # the context cap cut this turn
        if ep.n_turns >= self.cfg.max_turns:
            if self.cfg.force_answer and not ep.head:
                return self._force(ep)
            return self._close(ep, closed, MAX_TURNS)
        if turn.tool_call is not None:
            ep.pending = turn.tool_call
        else:
            raw = agent_format.TOOL_RE.findall(content)
            err = ("a <tool_call> must be closed with </tool_call>" if "<tool_call>" in content and not raw
                   else NO_ACTION)
            ep.pending = agent_format.ToolCall("", {}, err)

    def _close(self, ep: Episode, closed: str, reason: str) -> None:
        ep.add(self.chat.encode(closed[len(ep.text):]), 0)
        ep.text = closed
        ep.finish(reason)

    def _force(self, ep: Episode) -> None:
        """The last turn called a tool: the call is not run; the environment says so and opens one more
        turn with the answer begun for the policy (`agent.format.forced_answer_head`, mask 0), so the
        episode ends on an answer the policy writes, not on the cap (with no room for that turn it ends
        with `length` on the tool message, as any turn does)."""
        msg = {"role": "tool", "content": agent_format.tool_message(agent_format.NOT_RUN, True)}
        self._respond(ep, ep.messages + [msg], head=agent_format.forced_answer_head())

    def observe(self, ep: Episode, call, result) -> None:
        """Append the tool message (glue, mask 0) and, when there is room, the next turn's opening."""
        ep.tool_calls.append({
            "turn": ep.n_turns, "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False) if not call.error else
            _raw_call(ep.messages[-1]["content"]),
            "ok": bool(result.ok), "error": result.error, "cached": bool(result.cached),
            "seconds": float(result.seconds)})
        ep.pending = None
        last = self.cfg.is_last(ep.n_turns + 1)
        msgs = ep.messages + [{"role": "tool", "content": agent_format.tool_message(result.observation, last)}]
        self._respond(ep, msgs)

    def _respond(self, ep: Episode, msgs: list[dict], head: str = "") -> None:
        """Append the tool message that ends `msgs` (glue, mask 0) and, when there is room, the next
        turn's opening with `head` already written in it (mask 0; a forced answer's). One path for a
        tool's observation and for the forced answer's "not run", so both end alike at the edges."""
        try:
            closed, glue = self.chat.extend(ep.text, msgs)
            opened, opening = self.chat.extend(closed, msgs, open_turn=True)
        except TemplateError:
            self.template_faults += 1
            ep.finish("error")
            return
        ep.messages = msgs
        ep.add(self.chat.encode(glue), 0)
        ep.text = closed
        rest = self.chat.encode(opening) + self.chat.encode(head)  # encode("") is []
        if ep.n_tokens + len(rest) >= self.max_context:
            ep.finish(LENGTH)  # no room for another turn; the conversation ends on the tool message
            return
        ep.reopen = (len(ep.completion_ids), closed)  # an engine error ends it on the tool message
        ep.add(rest, 0)
        ep.text, ep.head = opened + head, head


def _raw_call(content: str) -> str:
    """What the model wrote as its call, for the record (malformed calls keep their text)."""
    calls = agent_format.TOOL_RE.findall(content)
    if calls:
        return calls[-1].strip()[:agent_format.MAX_ARG_CHARS]
    i = content.rfind("<tool_call>")
    return content[i + len("<tool_call>"):].strip()[:agent_format.MAX_ARG_CHARS] if i >= 0 else ""
