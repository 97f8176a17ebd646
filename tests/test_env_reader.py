"""The reading agent of browse_webpage: segmentation, the BM25 reader, LLM readers, memory."""

from __future__ import annotations

import json
import random

import pytest

from atomcli import plugins
from atomcli.agent.format import parse_tool_call
from atomcli.context import Context
from atomcli.env.reader import (
    BM25Reader,
    LLMReader,
    Memory,
    parse_reader_reply,
    split_segments,
)
from atomcli.env.tools import NOTHING_NEW, ToolBox
from atomcli.errors import InputError
from atomcli.retry import RetryPolicy
from atomcli.rewards.judges import JudgeError

FILLER = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
          "upsilon phi chi psi omega").split()


def filler_paragraph(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(n)).capitalize() + "."


def long_page(seed=0, facts=((7, "Amaris Volt mapped the Zorbl River in 1823."),)) -> str:
    rng = random.Random(seed)
    paras = [filler_paragraph(rng, rng.randint(40, 160)) for _ in range(30)]
    for i, fact in facts:
        paras[i] = paras[i] + " " + fact
    return "\n".join(paras)


def test_segments_are_paragraph_aligned_and_bounded():
    text = long_page()
    segs = split_segments(text)
    sizes = [len(s.split()) for s in segs]
    assert all(n <= 500 for n in sizes)
    assert all(n >= 300 for n in sizes[:-1])  # only the last one may be short
    assert " ".join(segs).split() == text.split()  # nothing lost, nothing reordered


def test_a_huge_paragraph_is_split_at_sentences():
    text = " ".join(f"Sentence number {i} has exactly seven words." for i in range(400))
    segs = split_segments(text)
    assert len(segs) >= 5 and all(len(s.split()) <= 500 for s in segs)
    assert all(s.endswith("words.") for s in segs)
    unpunctuated = "word " * 1234
    assert [len(s.split()) for s in split_segments(unpunctuated)] == [500, 500, 234]


def test_bm25_reader_returns_the_matching_segment_in_page_order():
    text = long_page(facts=((25, "Port Ember has 88,000 inhabitants."), (3, "Port Ember lies in the Zorbl delta.")))
    reader = BM25Reader(budget_words=300)
    out = reader.read_page(text, "Port Ember inhabitants", Memory())
    assert "88,000 inhabitants" in out
    assert len(out.split()) < 1100  # stopped after enough, not the whole page
    if "Zorbl delta" in out:  # both picked: page order kept
        assert out.index("Zorbl delta") < out.index("88,000")
    scores = reader.scores(split_segments(text), "Port Ember inhabitants")
    best = max(range(len(scores)), key=scores.__getitem__)
    assert "88,000" in split_segments(text)[best]


def test_bm25_reader_without_a_match_returns_the_beginning():
    text = long_page()
    out = BM25Reader().read_page(text, "quasar telescope", Memory())
    assert out.startswith("(nothing on this page matches the query; the page begins:)\n")
    assert split_segments(text)[0].split("\n")[0][:60] in out
    assert not BM25Reader().read_page(text, "", Memory()).startswith("(nothing")


def test_memory_returns_only_what_is_new():
    mem = Memory()
    assert mem.only_new("A fact. Another fact.") == "A fact. Another fact."
    assert mem.only_new("A  FACT. A third fact.") == "A third fact."
    assert mem.only_new("another fact") == ""


@pytest.mark.parametrize("reply, expected", [
    ('{"extracted": "Volt mapped it in 1823.", "continue": false}', ("Volt mapped it in 1823.", False)),
    ('```json\n{"extracted": ["a", "b"], "continue": "no"}\n```', ("a\nb", False)),
    ('<think>let me see {"x": 1}</think> Sure! {"extracted": "", "continue": true}', ("", True)),
    ("extracted: Volt, 1823, continue: false", ("Volt, 1823", False)),
    ("The river is 412 km long.", ("The river is 412 km long.", True)),
    ("None.", ("", True)),
    ("", ("", True)),
    ('{"extracted": {"year": 1823}}', ('{"year": 1823}', True)),
    (None, ("", True)),
])
def test_reader_replies_are_parsed_leniently(reply, expected):
    assert parse_reader_reply(reply) == expected


class Scripted:
    """A reader model that answers from a script and records its prompts."""

    def __init__(self, answer):
        self.answer, self.prompts = answer, []

    def __call__(self, prompts):
        self.prompts.append(list(prompts))
        return [self.answer(p) for p in prompts]


def _segment(prompt: str) -> str:
    return prompt.split('"""')[1]


def test_llm_reader_reads_in_order_and_stops_when_told():
    text = long_page(facts=((12, "Amaris Volt mapped the Zorbl River in 1823."),))
    n_segs = len(split_segments(text))

    def answer(p):
        if "Amaris Volt" in _segment(p):
            return json.dumps({"extracted": "Amaris Volt mapped the Zorbl River in 1823.", "continue": False})
        return json.dumps({"extracted": "", "continue": True})

    model = Scripted(answer)
    out = LLMReader(model, "t", max_segments=50).read_pages([("u", text)], "who mapped the Zorbl", Memory())
    assert out == ["Amaris Volt mapped the Zorbl River in 1823."]
    fact_seg = next(i for i, s in enumerate(split_segments(text)) if "Amaris" in s)
    assert len(model.prompts) == fact_seg + 1 < n_segs  # read in order, stopped after the fact
    assert "part 1 of" in model.prompts[0][0] and "Goal: who mapped the Zorbl" in model.prompts[0][0]


def test_llm_reader_batches_pages_and_keeps_memory_across_calls():
    pages = [("u1", "Page one says the river is 412 km long."), ("u2", "Page two says the river is 412 km long. "
                                                                  "It floods every spring.")]
    model = Scripted(lambda p: json.dumps({"extracted": _segment(p).strip(), "continue": True}))
    reader, mem = LLMReader(model, "t"), Memory()
    first = reader.read_pages(pages, "river", mem)
    assert len(model.prompts) == 1 and len(model.prompts[0]) == 2  # one batch for both pages
    assert first == ["Page one says the river is 412 km long.",
                     "Page two says the river is 412 km long. It floods every spring."]
    again = reader.read_pages(pages[1:], "river", mem)
    assert again == [""]  # nothing new for this question
    assert "It floods every spring." in model.prompts[-1][0]  # the memory is shown to the reader


class _Local:
    """A local backend holding one page of `text` at every url."""
    name = "local"
    traits = plugins.SearchTraits("local", local_documents=True)

    def __init__(self, text: str):
        self.text = text

    def search(self, query, k):
        return []

    def read_local(self, url):
        return self.text


def test_policy_reader_through_the_toolbox(monkeypatch):
    page = _Local("The Quiv River rises in Lowtown. It is 12 km long.")
    monkeypatch.setitem(plugins.SEARCH, "readertest", lambda arg, ctx, **o: page)
    model = Scripted(lambda p: 'Here you go: {"extracted": "It is 12 km long.", "continue": false}')
    tb = ToolBox("readertest", Context(quiet=True), reader="policy", reader_fn=model)
    call = parse_tool_call(json.dumps({"name": "browse_webpage",
                                       "arguments": {"url_list": ["local://1"], "query": "length"}}))
    assert tb.run(call, "traj-1").observation == "Page local://1:\nIt is 12 km long."
    assert tb.run(call, "traj-1").observation == f"Page local://1:\n{NOTHING_NEW}"
    assert tb.run(call, "traj-2").observation == "Page local://1:\nIt is 12 km long."  # other question


def test_judge_reader_is_loaded_lazily_and_failures_become_observations(monkeypatch):
    class Judge:
        calls = 0

        def complete(self, prompts):  # like atomcli.rewards.judges: failures come back in place of replies
            Judge.calls += 1
            return [JudgeError("judge server down") for _ in prompts]

    monkeypatch.setitem(plugins.SEARCH, "readertest2", lambda arg, ctx, **o: _Local("Some text."))
    ctx = Context(quiet=True)
    loaded = []
    ctx.judge = lambda spec, **kw: loaded.append(spec) or Judge()
    tb = ToolBox("readertest2", ctx, reader="openai:http://127.0.0.1:9/v1#m",
                 retry=RetryPolicy(attempts=2, base=0.001))
    assert loaded == []
    res = tb.run(parse_tool_call(json.dumps({"name": "browse_webpage", "arguments": {"url_list": ["x"]}})))
    assert loaded == ["openai:http://127.0.0.1:9/v1#m"]
    assert not res.ok and "judge server down" in res.error
    assert Judge.calls == 2  # retried within bounds


def test_bad_reader_names_fail_before_anything_runs():
    with pytest.raises(InputError, match="unknown judge `nope`"):
        ToolBox("", Context(quiet=True), reader="nope")
    with pytest.raises(InputError, match="cannot read pages"):
        ToolBox("", Context(quiet=True), reader="heuristic")
    with pytest.raises(InputError, match="reader `policy` needs"):
        ToolBox("", Context(quiet=True), reader="policy")
