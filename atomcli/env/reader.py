"""The reading agent of `browse_webpage` (DeepResearcher's): page text in, what
is new and relevant to the browse query out.

A page is split into segments of ~300-500 words and read in order by one of two readers:

- `BM25Reader` (cheap, deterministic, no model): scores the segments of the page against
  the query with BM25, takes the best ones until a word budget is spent, and returns them in
  page order; with no query (or no match) it returns the beginning of the page.
- `LLMReader` (the policy via the rollout's `reader_fn`, or a judge SPEC): shows the model
  one segment at a time with what was already extracted, asks for JSON
  `{"extracted": ..., "continue": true/false}` and stops when the model says the rest is
  not worth reading. Replies are parsed leniently: models emit fences, prose, `<think>`.

Both keep a per-question short-term `Memory` (the ToolBox keys it by trajectory) and return
only sentences not returned before, so re-browsing a page does not repeat itself.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from atomcli.agent.format import neutralize
from atomcli.retry import ToolFault

WORD_RE = re.compile(r"\w+", re.UNICODE)
# a sentence ends at . ! ? followed by space and something that can start a sentence
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9À-Ý])")
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have he her his i in is it its of on or she that the their "
    "them they this to was were what when where which who whom whose why will with how did does do you your "
    "find about than then there these those into over also been being can could would should may".split())

SEGMENT_WORDS = 400   # target words per segment
SEGMENT_MAX = 500     # no segment longer than this (long paragraphs are split at sentences)


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_RE.split(text) if s.strip()]


def split_segments(text: str, target: int = SEGMENT_WORDS, max_words: int = SEGMENT_MAX) -> list[str]:
    """Paragraph-aligned segments of about `target` words, never more than `max_words`."""
    pieces: list[tuple[str, int]] = []  # (text, words); long paragraphs broken into sentence runs
    for para in (p.strip() for p in text.split("\n")):
        if not para:
            continue
        n = len(para.split())
        if n <= max_words:
            pieces.append((para, n))
            continue
        run, run_n = [], 0
        for sent in split_sentences(para):
            tokens = sent.split()
            while len(tokens) > max_words:  # a "sentence" with no punctuation at all
                if run:
                    pieces.append((" ".join(run), run_n))
                    run, run_n = [], 0
                pieces.append((" ".join(tokens[:max_words]), max_words))
                tokens = tokens[max_words:]
            if run_n + len(tokens) > max_words and run:
                pieces.append((" ".join(run), run_n))
                run, run_n = [], 0
            if tokens:
                run.append(" ".join(tokens))
                run_n += len(tokens)
        if run:
            pieces.append((" ".join(run), run_n))
    segments, cur, cur_n = [], [], 0
    for piece, n in pieces:
        if cur and cur_n + n > max_words:
            segments.append("\n".join(cur))
            cur, cur_n = [], 0
        cur.append(piece)
        cur_n += n
        if cur_n >= target:
            segments.append("\n".join(cur))
            cur, cur_n = [], 0
    if cur:
        segments.append("\n".join(cur))
    return segments


def _sentence_key(sentence: str) -> str:
    return " ".join(words(sentence))


@dataclass
class Memory:
    """Short-term memory of one question: what the reader already returned."""
    seen: set = field(default_factory=set)          # sentence keys already returned
    notes: list = field(default_factory=list)       # extracted texts, in order (shown to LLM readers)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def only_new(self, text: str, commit: bool = True, extra_seen: set | None = None) -> str:
        """`text` without the sentences already returned (line structure kept)."""
        out_lines = []
        for line in text.split("\n"):
            kept = []
            for sent in split_sentences(line) or ([line] if line.strip() else []):
                key = _sentence_key(sent)
                if not key:
                    continue
                if key in self.seen or (extra_seen is not None and key in extra_seen):
                    continue
                if commit:
                    self.seen.add(key)
                elif extra_seen is not None:
                    extra_seen.add(key)
                kept.append(sent)
            if kept:
                out_lines.append(" ".join(kept))
        return "\n".join(out_lines)


class BM25Reader:
    """Best-matching segments for the query, in page order, until `budget_words` are returned."""
    name = "bm25"

    def __init__(self, budget_words: int = 400, max_segments: int = 200, k1: float = 1.2, b: float = 0.75):
        self.budget_words, self.max_segments, self.k1, self.b = budget_words, max_segments, k1, b

    def scores(self, segments: list[str], query: str) -> list[float]:
        terms = [t for t in dict.fromkeys(words(query)) if t not in STOPWORDS] or list(dict.fromkeys(words(query)))
        docs = [Counter(words(s)) for s in segments]
        if not terms or not docs:
            return [0.0] * len(segments)
        n = len(docs)
        avgdl = sum(sum(d.values()) for d in docs) / n or 1.0
        df = {t: sum(1 for d in docs if t in d) for t in terms}
        out = []
        for d in docs:
            dl = sum(d.values())
            s = 0.0
            for t in terms:
                tf = d.get(t, 0)
                if tf:
                    idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                    s += idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * dl / avgdl))
            out.append(s)
        return out

    def read_page(self, text: str, query: str, memory: Memory) -> str:
        segments = split_segments(text)[: self.max_segments]
        if not segments:
            return ""
        scores = self.scores(segments, query)
        order = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        lead = not order
        if lead:  # no query, or nothing matches it: the beginning of the page says what it is
            order = list(range(len(segments)))
        chosen: dict[int, str] = {}
        staged: set = set()
        total = 0
        for i in order:
            if total >= self.budget_words:
                break  # enough: the rest is less relevant than what is already taken
            new = memory.only_new(segments[i], commit=False, extra_seen=staged)
            if new:
                chosen[i] = new
                total += len(new.split())
        memory.seen |= staged
        text_out = "\n".join(chosen[i] for i in sorted(chosen))
        if lead and text_out and query.strip():
            text_out = "(nothing on this page matches the query; the page begins:)\n" + text_out
        return text_out

    def read_pages(self, pages: list[tuple[str, str]], query: str, memory: Memory) -> list[str]:
        return [self.read_page(text, query, memory) for _url, text in pages]


READER_PROMPT = """You are the reading assistant of a research agent. Read one part of a web page and \
extract the information that helps with the agent's goal.

Goal: {query}
Page: {url} (part {part} of {parts})
Already extracted (do not repeat it):
{known}

Page text:
\"\"\"
{segment}
\"\"\"

Reply with one JSON object and nothing else:
{{"extracted": "<facts from this part that help with the goal and are not already extracted, quoted or \
closely paraphrased; empty if none>", "continue": <true if later parts of the page may still help, else false>}}"""


MAX_REPLY_CHARS = 32768  # 20x the extract kept per segment (LLMReader.max_extract_chars)


def parse_reader_reply(reply: str) -> tuple[str, bool]:
    """(extracted, continue) from a model reply; never raises. Garbage -> ("", True)."""
    text = reply if isinstance(reply, str) else ""
    text = re.sub(r"<think>.*?(</think>|$)", "", text, flags=re.S).strip()
    # a failed decode costs O(position) (the error locates its line), so trying every "{" of a
    # garbage reply is quadratic: read only as much as a reply for one segment can need
    text = text[:MAX_REPLY_CHARS]
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, m.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and ("extracted" in obj or "continue" in obj):
            ext = obj.get("extracted", "")
            if isinstance(ext, list):
                ext = "\n".join(str(x) for x in ext if x)
            elif ext is None or ext is False:
                ext = ""
            elif not isinstance(ext, str):
                ext = json.dumps(ext, ensure_ascii=False)
            cont = obj.get("continue", True)
            if isinstance(cont, str):
                cont = cont.strip().lower() not in ("false", "no", "0", "stop")
            return ext.strip(), bool(cont)
    # no JSON: look for the fields written loosely, else take the prose itself
    stop = re.search(r"[\"']?continue[\"']?\s*[:=]\s*[\"']?(false|no)\b", text, re.I) is not None
    m = re.search(r"[\"']?extracted[\"']?\s*[:=]\s*[\"']?(.*?)[\"']?\s*(,\s*[\"']?continue|\}|$)", text, re.I | re.S)
    ext = m.group(1) if m else re.sub(r"```\w*", "", text)
    ext = ext.strip()
    if ext.lower().strip(" .") in ("", "none", "n/a", "nothing", "null", "no relevant information"):
        ext = ""
    return ext, not stop


class LLMReader:
    """Reads segments in order with a text-completion function (prompts -> replies), batched
    across the pages of one browse call; stops per page when the model says so."""

    def __init__(self, complete: Callable[[list[str]], list[str]], name: str, max_segments: int = 8,
                 max_extract_chars: int = 1500, known_chars: int = 2000):
        self.complete, self.name = complete, name
        self.max_segments, self.max_extract_chars, self.known_chars = max_segments, max_extract_chars, known_chars

    def _known(self, notes: list[str]) -> str:
        text, out = 0, []
        for note in reversed(notes):  # the most recent notes, within the budget
            if text + len(note) > self.known_chars:
                break
            out.append("- " + note.replace("\n", " "))
            text += len(note)
        return "\n".join(reversed(out)) or "(nothing yet)"

    def read_pages(self, pages: list[tuple[str, str]], query: str, memory: Memory) -> list[str]:
        segs = [split_segments(text)[: self.max_segments] for _url, text in pages]
        pos = [0] * len(pages)
        active = [bool(s) for s in segs]
        found: list[list[str]] = [[] for _ in pages]
        goal = query.strip() or "what this page says"
        while any(active):
            idx = [i for i, a in enumerate(active) if a]
            prompts = [READER_PROMPT.format(query=goal, url=pages[i][0], part=pos[i] + 1, parts=len(segs[i]),
                                            # page text is data: no forged chat control tokens
                                            known=neutralize(self._known(memory.notes + found[i])),
                                            segment=neutralize(segs[i][pos[i]]))
                       for i in idx]
            replies = list(self.complete(prompts))
            if len(replies) != len(prompts):
                raise RuntimeError(f"reader {self.name} returned {len(replies)} replies for {len(prompts)} prompts")
            for i, reply in zip(idx, replies):
                if isinstance(reply, BaseException):  # judges return their per-prompt failures
                    raise ToolFault(f"reader {self.name} failed: {reply}")
                extracted, cont = parse_reader_reply(reply)
                if extracted:
                    found[i].append(extracted[: self.max_extract_chars])
                pos[i] += 1
                active[i] = cont and pos[i] < len(segs[i])
        out = []
        for notes in found:  # committed in url order, so the result does not depend on timing
            new = memory.only_new("\n".join(notes))
            if new:
                memory.notes.append(new)
            out.append(new)
        return out
