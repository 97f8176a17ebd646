"""What the scripted experts share: the demo world's (`atomcli.demo.expert`) and the real-text one
(`atomcli.demo.real_sft`), which write the SFT trajectories of `atom demo-world`.

- `expert_trajectories`: runs an expert over an index with the real `ToolBox` (k = `SFT_K`), keeping the
  well-formed rows that answer exactly;
- `Recorder`: writes the turns of one trajectory, running every tool call through that `ToolBox` (the
  observations are what a rollout with the same index and k would see) and building the trajectory row
  in the contract's columns;
- `key_terms`: the words of a question that carry its meaning (queries are built from them, never from
  a fixed phrase);
- `say`: phrase banks with several wordings for each kind of thought, so no single sentence is in every
  trajectory, and nothing in them names a number of hops or links that the question does not show;
- evidence (`results`, `quote`, `copy_span`): where a value occurs in an observation, and the sentence
  that states it (the answer is copied from there, so no trajectory answers with a fact it did not receive).
"""

from __future__ import annotations

import json
import random
import re

from atomcli.env import search_local

SFT_K = 3                   # search results per query for the experts: a rollout with `--k 3` sees the same
SYSTEM_DATE = "2026-01-01"  # the date in the experts' system prompt
POLICY = "research-expert"  # the `policy` column of the real-text expert's rows

# Question words and glue on top of the search engine's stopwords: a query is content words only.
_EXTRA_STOP = frozenset({"what", "which", "who", "whom", "whose", "where", "when", "how", "why", "does", "did", "do",
                         "is", "was", "were", "are", "the", "a", "an", "of", "in", "on", "at", "to", "for", "by",
                         "from", "with"})
_TERM_RE = re.compile(r"[\w][\w.\-]*(?:\(\)|\[\])?")


def key_terms(text: str) -> list[str]:
    """Content words of `text` in order, each once (case kept: identifiers stay searchable as written)."""
    from atomcli.env.search_local import STOPWORDS
    out, seen = [], set()
    for tok in _TERM_RE.findall(re.sub(r"'s\b", "", text)):  # "PRAGMA's" -> "PRAGMA"
        tok = tok.rstrip(".-")
        low = tok.lower()
        if (len(tok) > 1 or tok.isdigit()) and low not in STOPWORDS and low not in _EXTRA_STOP and low not in seen:
            seen.add(low)
            out.append(tok)
    return out


# --- wording ------------------------------------------------------------------------------------

PHRASES = {
    "plan_start": (
        "The question is about {terms}; start with {goal}.",
        "To answer I need {goal} first.",
        "Key terms here are {terms}; begin by finding {goal}.",
        "First step: {goal}.",
        "I will look up {goal} before anything else.",
        "Nothing is known yet, so search for {goal}.",
        "Work from the named thing outward: {goal}.",
        "Start from what the question names: {goal}.",
    ),
    "plan_next": (
        "With that settled, find {goal}.",
        "Now {goal}.",
        "Next: {goal}.",
        "That gives the next subject; look up {goal}.",
        "Move on to {goal}.",
        "The remaining unknown is {goal}.",
    ),
    "search": (
        "Search with the question's own terms: {query}.",
        "Query: {query}.",
        "Try the search {query}.",
        "Search for {query}.",
        "Look for pages matching {query}.",
        "Run a search on {query}.",
    ),
    "miss": (
        "None of the results is about {target}; the query did not pin it down.",
        "These results are about other things, not {target}.",
        "No result is the page on {target}: the query was too vague.",
        "The top results miss {target} entirely.",
        "Nothing here answers it; {target} is not among the results.",
    ),
    "rewrite": (
        "Rewrite the query instead of repeating it: {query}.",
        "A sharper query: {query}.",
        "Rephrase with more specific words: {query}.",
        "Change the query to {query}.",
        "Try different terms: {query}.",
    ),
    "snippet_short": (
        "The page on {target} is in the results, but its snippet stops before {goal}.",
        "The {target} result is right, yet the snippet does not show {goal}.",
        "The snippet only mentions {target}; the page itself should say {goal}.",
        "Right page, cut snippet: {goal} is not visible.",
    ),
    "browse": (
        "Open the page and read it.",
        "Read the full page for {goal}.",
        "Browse the page to find {goal}.",
        "Open {url} and look for {goal}.",
    ),
    "found": (
        "The page says \"{quote}\".",
        "Found it: \"{quote}\".",
        "The text states \"{quote}\".",
        "Evidence: \"{quote}\".",
        "It reads: \"{quote}\".",
    ),
    # the tempting sentence first, the answer's second: one fixed order the policy can copy (with a random
    # order the policy took the second sentence either way, and transferred worse)
    "rival": (
        "One result says \"{rival}\", another \"{quote}\".",
        "Two values: \"{rival}\" and \"{quote}\".",
        "The results say \"{rival}\" but also \"{quote}\".",
    ),
    "pick": (
        "The question asks about {cue}, which only the {which} states: {answer}.",
        "Only the {which} is about {cue}, as the question is: {answer}.",
        "The question says {cue}; that is the {which} sentence, so {answer}.",
    ),
    "verify": (
        "This comes from the page on {target} itself, so it is about the right entity.",
        "The result title is {target}, so the fact belongs to it.",
        "Checked: the sentence is on the {target} page.",
    ),
    "done": (
        "That answers the question: {answer}.",
        "The evidence is in hand; the answer is {answer}.",
        "No more searching needed: {answer}.",
        "Answer with the span from the page: {answer}.",
        "Enough evidence; answer {answer}.",
    ),
}


def say(rng: random.Random, kind: str, **fields) -> str:
    return rng.choice(PHRASES[kind]).format(**fields)


# --- evidence -----------------------------------------------------------------------------------

RESULT_RE = re.compile(r"^\d+\. (?P<title>.*)\n   url: (?P<url>\S*)\n   (?P<snippet>.*)$", re.MULTILINE)
# list items are sentences too, and so is each `#define` of a C header excerpt (a run of them has no period, and
# quoted whole it overran a turn's 192 tokens)
_SENTENCE_CUT = re.compile(r"(?<=[.!?])\s+|\n+|…|\s-\s|\s(?=#define\b)")


def results(obs: str) -> list[dict]:
    """The search results of an observation: [{title, url, snippet}] in rank order."""
    return [m.groupdict() for m in RESULT_RE.finditer(obs)]


def value_pattern(value: str) -> re.Pattern:
    """`value` as a whole word (case-insensitive): "7" must not match inside "127"."""
    return re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)", re.IGNORECASE)


def sentences(text: str) -> list[str]:
    """`text` cut into the sentences a quote is taken from (list items and `#define` lines are sentences)."""
    return [s.strip() for s in _SENTENCE_CUT.split(text) if s and s.strip()]


def term_hits(text: str, terms: list[str]) -> int:
    """How many of the question's key `terms` `text` contains (case-insensitive substrings)."""
    low = text.lower()
    return sum(t.lower() in low for t in terms)


_QUOTE_MIN_WORDS = 4  # a quote cut at its value keeps at least this many words, or it is no sentence to read


def quote(text: str, value: str, terms: list[str] = (), max_words: int = 24, *, end_at_value: bool = False) -> str | None:
    """The sentence of `text` that states `value` (most key terms first), cut to `max_words`; None if absent.

    `end_at_value` cuts the sentence just after the value (keeping the `max_words` words before it), so the
    answer is the quote's last words: a small model then copies the words it just wrote instead of picking a
    span out of the middle of a sentence. A value in the sentence's first words keeps the sentence."""
    pat = value_pattern(value)
    best, best_score = None, -1
    for sent in sentences(text):
        if pat.search(sent):
            score = term_hits(sent, terms)
            if score > best_score:
                best, best_score = sent, score
    if best is None:
        return None
    hit = pat.search(best)
    if end_at_value:
        head = best[:hit.end()].split()
        if len(head) >= _QUOTE_MIN_WORDS:
            return " ".join(head[-max_words:])
    words = best.split()
    if len(words) > max_words:  # keep the words around the value
        at = len(best[:hit.start()].split())
        lo = max(0, min(at - max_words // 2, len(words) - max_words))
        best = " ".join(words[lo:lo + max_words])
    return best.rstrip(".")


def copy_span(text: str, value: str) -> str | None:
    """`value` as the observation writes it (its casing), or None when it is not there."""
    m = value_pattern(value).search(text)
    return m.group(0) if m else None


# --- one trajectory -----------------------------------------------------------------------------

def units_text(units: list[tuple[str, str]]) -> str:
    return "".join(f"<{t}>{x}</{t}>" for t, x in units)


class Recorder:
    """Writes one trajectory's turns, running each tool call through `toolbox` as a rollout would."""

    def __init__(self, toolbox, row: dict, traj_id: str):
        from atomcli.agent import format as af
        self.tb, self.row, self.traj_id = toolbox, row, traj_id
        self.msgs = [{"role": "system", "content": af.system_prompt(date=SYSTEM_DATE)},
                     {"role": "user", "content": af.user_message(row["question"])}]
        self.calls: list[dict] = []
        self.queries: list[str] = []      # every query issued, so none is ever repeated
        self.seen: list[str] = []         # every observation received

    def act(self, units: list[tuple[str, str]], name: str, args: dict) -> str:
        from atomcli.agent import format as af
        raw = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        self.msgs.append({"role": "assistant", "content": f"<think>{units_text(units)}</think><tool_call>{raw}</tool_call>"})
        parsed = af.parse_tool_call(raw)  # exactly what a rollout would parse from this turn
        res = self.tb.run(parsed, self.traj_id)
        self.calls.append({"turn": sum(m["role"] == "assistant" for m in self.msgs), "name": name,
                           "arguments": json.dumps(parsed.arguments, ensure_ascii=False), "ok": bool(res.ok),
                           "error": res.error, "cached": bool(res.cached),
                           "seconds": None})  # wall time would make the file differ run to run
        self.msgs.append({"role": "tool", "content": af.tool_message(res.observation)})
        self.seen.append(res.observation)
        return res.observation

    def search(self, units: list[tuple[str, str]], query: str) -> str:
        self.queries.append(query.lower())
        return self.act(units, "web_search", {"query": [query]})

    def browse(self, units: list[tuple[str, str]], url: str, query: str) -> str:
        return self.act(units, "browse_webpage", {"url_list": [url], "query": query})

    def issued(self, query: str) -> bool:
        return query.lower() in self.queries

    def finish(self, units: list[tuple[str, str]], answer: str) -> dict:
        """The answer turn and the trajectory row (contract columns, as a rollout writes them)."""
        from atomcli.agent import format as af
        self.msgs.append({"role": "assistant", "content": f"<think>{units_text(units)}</think><answer>{answer}</answer>"})
        self.tb.forget(self.traj_id)
        n = self.calls
        return {**self.row, "traj_id": self.traj_id, "group_id": self.row["id"], "sample_idx": 0, "policy": POLICY,
                "messages": self.msgs, "answer": answer, "finish_reason": "answer",
                "format_ok": af.trajectory_format_ok(self.msgs),
                "n_turns": sum(m["role"] == "assistant" for m in self.msgs),
                "n_search": sum(c["name"] == "web_search" for c in n),
                "n_browse": sum(c["name"] == "browse_webpage" for c in n), "tool_calls": n}


# --- running an expert ---------------------------------------------------------------------------

def expert_trajectories(spec: str, ctx, make_expert, questions, golden, limit: int | None = None,
                        snippets: str = search_local.PAGE_ORDER):
    """SFT rows an expert writes with the real tools over the index `spec`: up to `limit` rows that are
    well formed and answer exactly (F1 1), and how many were dropped. `make_expert(toolbox)` builds the
    expert, `golden(question)` gives its golden answers; `snippets` is the index's snippet order (the
    `snippets=` search option its rollouts will use). The ToolBox is closed and its cached search
    forgotten afterwards: the index lives in a folder about to be renamed or deleted."""
    from atomcli.env.tools import ToolBox
    from atomcli.rewards import metrics
    rows, dropped = [], 0
    options = search_local.snippet_options(snippets)
    toolbox = ToolBox(spec, ctx, k=SFT_K, search_options=options)
    try:
        expert = make_expert(toolbox)
        for q in questions:
            if limit is not None and len(rows) >= limit:
                break
            row = expert.solve(q)
            if row and row["format_ok"] and metrics.f1(row["answer"], golden(q)) == 1.0:
                rows.append(row)
            else:
                dropped += 1
    finally:
        toolbox.close()
        toolbox.backend.close()
        ctx.forget_search(spec, **options)
    return rows, dropped
