"""Hardening: every parser of model or server output is total *and* bounded in time.

Complements tests/test_metrics.py (metrics total and bounded on short text) and
tests/test_score_rrm.py::test_agent_format_parsers_are_total (parsers never raise on
fragments of the agent format). Here: the linear-time parsers match the regexes they
replaced exactly, tool-call arguments are bounded whatever the JSON, generated well-formed
turns round-trip, adversarial megabyte inputs finish in well under a second, and text from
the environment can never forge a chat-template control token.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atomcli.agent import format as agent_format
from atomcli.env import reader
from atomcli.rewards import metrics, rrm_prompt

# --- the linear parsers are the regexes they replaced ----------------------------------------------
from atomcli.stages import evaluate, score_rrm

ORACLE = {
    "think": re.compile(r"<think>(.*?)</think>", re.S),
    "answer": re.compile(r"<answer>(.*?)</answer>", re.S),
    "tool": re.compile(r"<tool_call>(.*?)</tool_call>", re.S),
    "unit": re.compile(r"<([A-Z][A-Z0-9_]*)>(.*?)</\1>", re.S),
}
OURS = {"think": agent_format.THINK_RE, "answer": agent_format.ANSWER_RE, "tool": agent_format.TOOL_RE,
        "unit": agent_format.UNIT_RE}
TAGS = ["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<A>", "</A>", "<B_1>",
        "</B_1>", "<AB>", "</AB>", "<a>", "</a>", "<", ">", "</", "/", "A", "x", " ", "\n", "<A", "A>"]
tagged_text = st.lists(st.sampled_from(TAGS) | st.text(max_size=3), max_size=40).map("".join)


@settings(max_examples=1500, deadline=None)
@given(text=tagged_text)
def test_linear_tag_parsers_find_exactly_what_the_regexes_found(text):
    for name, regex in ORACLE.items():
        assert OURS[name].findall(text) == regex.findall(text), name


ADVERSARIAL = {  # each ~1 MB; the regexes took minutes on a few hundred KB of these
    "unclosed think": "<think>" * 150_000,
    "unclosed answer": "<answer>" * 130_000,
    "unclosed tool_call": "<tool_call>" * 95_000,
    "unclosed units": "<think>" + "<A>" * 330_000 + "</think>",
    "mixed": "<A><B_1><think><answer><tool_call>{" * 30_000,
    "closed units": "<think>" + "<A>x</A>" * 120_000 + "</think><answer>y</answer>",
    "deep json": "<tool_call>" + "[" * 500_000 + "</tool_call>",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_agent_format_parsers_take_linear_time(name):
    text = ADVERSARIAL[name]
    t0 = time.perf_counter()
    agent_format.atomic_thoughts(text)
    turn = agent_format.parse_turn(text)
    agent_format.extract_answer(text)
    agent_format.trajectory_format_ok([{"role": "assistant", "content": text}] * 3)
    score_rrm.trajectory_steps([{"role": "assistant", "content": text}, {"role": "tool", "content": text}])
    assert time.perf_counter() - t0 < 3.0  # about 0.05 s here; the regexes needed minutes
    if turn.tool_call is not None:
        assert turn.tool_call.error  # a 500k-deep JSON array is an error observation, not a crash


@pytest.mark.parametrize("reply", ["[1, " * 250_000, "[" * 1_000_000, "[1] " * 250_000, "]" + "[7," * 300_000])
def test_judge_reply_parsers_take_linear_time(reply):
    t0 = time.perf_counter()
    assert score_rrm.parse_scores(reply, 3) is None
    evaluate.parse_verdict(reply)
    assert time.perf_counter() - t0 < 3.0  # parse_scores decoded from every "[": ~15 min at 1 MB


def test_reader_reply_parser_is_bounded_on_the_largest_reply_a_judge_may_return():
    from atomcli.rewards.judges import (
        MAX_RESPONSE_BYTES,  # replies beyond this are refused by the client
    )
    for reply in ("{1, " * (MAX_RESPONSE_BYTES // 4), "{" * MAX_RESPONSE_BYTES,
                  '{"extracted": "' + "x" * MAX_RESPONSE_BYTES):
        t0 = time.perf_counter()
        extracted, cont = reader.parse_reader_reply(reply)
        assert isinstance(extracted, str) and isinstance(cont, bool)
        assert time.perf_counter() - t0 < 5.0


def _old_parse_scores(reply, n):
    """parse_scores as it was (decode from every "["), the oracle for the linear version."""
    if not isinstance(reply, str) or n <= 0:
        return None
    decoder, found, pos = json.JSONDecoder(), None, reply.find("[")
    while pos != -1:
        try:
            obj, _ = decoder.raw_decode(reply, pos)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, list) and len(obj) == n and all(rrm_prompt._is_number(x) for x in obj):
            found = obj
        pos = reply.find("[", pos + 1)
    if found is None or not all(0 <= x <= 10 for x in found):
        return None
    return [float(x) for x in found]


REPLY_BITS = ["[", "]", "[7, 3]", "[1,2,3]", "[[4, 5]]", '{"s": [2, 9]}', "10", "11", "-1", "7.5", "true", '"7"',
              "NaN", "Infinity", ",", " ", "```json\n", "\n```", "scores:", '"]"', '"["', "1e400", "null", "{", "}"]
judge_reply = st.lists(st.sampled_from(REPLY_BITS) | st.text(max_size=3), max_size=20).map("".join)


@settings(max_examples=1500, deadline=None)
@given(reply=judge_reply, n=st.integers(1, 3))
def test_linear_parse_scores_agrees_with_decoding_from_every_bracket(reply, n):
    assert rrm_prompt.parse_scores(reply, n) == _old_parse_scores(reply, n)


# --- tool calls: any JSON in, a bounded call or an error out -------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "arguments", "query", "url_list", "urls", "x"]) | st.text(max_size=5), inner,
        max_size=4),
    max_leaves=20)
call_objects = st.fixed_dictionaries({
    "name": st.sampled_from(["web_search", "browse_webpage", "search", ""]) | json_values,
    "arguments": json_values | st.fixed_dictionaries({}, optional={
        "query": json_values | st.lists(st.text(max_size=30), max_size=6) | st.text(max_size=30),
        "url_list": json_values | st.lists(st.text(max_size=30), max_size=6) | st.text(max_size=30)}),
}) | json_values


def _check_bounded(call):
    assert isinstance(call, agent_format.ToolCall)
    if call.error is not None:
        assert isinstance(call.error, str) and call.error and call.arguments == {}
        assert len(call.name) <= 100
        return
    assert call.name in agent_format.TOOL_NAMES
    if call.name == "web_search":
        q = call.arguments["query"]
        assert 1 <= len(q) <= agent_format.MAX_QUERIES
        assert all(isinstance(x, str) and x.strip() and len(x) <= agent_format.MAX_ARG_CHARS for x in q)
    else:
        urls = call.arguments["url_list"]
        assert 1 <= len(urls) <= agent_format.MAX_URLS
        assert all(isinstance(u, str) and u.strip() and len(u) <= agent_format.MAX_ARG_CHARS for u in urls)
        assert isinstance(call.arguments["query"], str) and len(call.arguments["query"]) <= agent_format.MAX_ARG_CHARS


@settings(max_examples=800, deadline=None)
@given(obj=call_objects, double_encode=st.booleans())
def test_any_json_gives_a_bounded_call_or_an_error(obj, double_encode):
    if double_encode and isinstance(obj, dict) and "arguments" in obj:
        obj = {**obj, "arguments": json.dumps(obj["arguments"])}  # some models double-encode
    _check_bounded(agent_format.parse_tool_call(json.dumps(obj)))


@settings(max_examples=300, deadline=None)
@given(queries=st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=5),
       urls=st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=5),
       query=st.text(max_size=40))
def test_valid_calls_round_trip(queries, urls, query):
    call = agent_format.parse_tool_call(json.dumps({"name": "web_search", "arguments": {"query": queries}}))
    assert call.error is None and call.arguments == {"query": [q.strip() for q in queries[:3]]}
    call = agent_format.parse_tool_call(json.dumps({"name": "browse_webpage",
                                                    "arguments": {"url_list": urls, "query": query}}))
    assert call.error is None and call.arguments == {"url_list": [u.strip() for u in urls[:3]], "query": query}


def test_ten_megabyte_arguments_are_cut_not_carried():
    huge = "q" * 10_000_000
    t0 = time.perf_counter()
    call = agent_format.parse_tool_call(json.dumps({"name": "web_search", "arguments": {"query": [huge] * 5}}))
    assert [len(q) for q in call.arguments["query"]] == [agent_format.MAX_ARG_CHARS] * 3
    call = agent_format.parse_tool_call(json.dumps({"name": "browse_webpage",
                                                    "arguments": {"url_list": [huge], "query": {"k": huge}}}))
    assert len(call.arguments["url_list"][0]) == len(call.arguments["query"]) == agent_format.MAX_ARG_CHARS
    assert time.perf_counter() - t0 < 5.0


# --- well-formed turns round-trip; answers and thoughts are recovered ----------------------------

tag_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,12}", fullmatch=True)
plain = st.text(max_size=30).filter(lambda s: "<" not in s and ">" not in s)
units = st.lists(st.tuples(tag_names, plain), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(units=units, answer=plain.filter(str.strip), query=plain.filter(str.strip), as_answer=st.booleans())
def test_generated_turns_parse_back(units, answer, query, as_answer):
    think = "<think>" + " ".join(f"<{t}>{b}</{t}>" for t, b in units) + "</think>"
    action = (f"<answer>{answer}</answer>" if as_answer else
              "<tool_call>" + json.dumps({"name": "web_search", "arguments": {"query": [query]}}) + "</tool_call>")
    text = think + "\n" + action
    turn = agent_format.parse_turn(text)
    assert turn.well_formed, turn.problems
    assert agent_format.atomic_thoughts(text) == [(t, b.strip()) for t, b in units]
    if as_answer:
        assert turn.answer == answer.strip() == agent_format.extract_answer(text)
        assert agent_format.trajectory_format_ok([{"role": "assistant", "content": text}])
    else:
        assert turn.tool_call.arguments == {"query": [query.strip()]} and turn.answer is None


@settings(max_examples=300, deadline=None)
@given(before=st.text(max_size=40), answers=st.lists(plain, min_size=1, max_size=3),
       after=st.text(max_size=40).filter(lambda s: "<answer>" not in s))
def test_the_last_answer_wins(before, answers, after):
    text = before + "".join(f"<answer>{a}</answer>" for a in answers) + after
    got = agent_format.extract_answer(text)
    if "<answer>" not in before and "</answer>" not in before:
        assert got == answers[-1].strip()
    else:
        assert isinstance(got, str)


# --- metrics: complements tests/test_metrics.py ----------------------------------------------------

any_text = st.text(max_size=30) | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                                           max_size=3)  # lone surrogates, as a JSON "\ud800" decodes
gold_lists = st.lists(any_text | st.none() | st.integers(), max_size=5)


@settings(max_examples=500, deadline=None)
@given(pred=any_text | st.none() | st.integers(), golds=gold_lists, data=st.data())
def test_metrics_are_orderless_and_consistent(pred, golds, data):
    shuffled = data.draw(st.permutations(golds))
    for fn in (metrics.f1, metrics.em, metrics.cover_em):
        assert fn(pred, golds) == fn(pred, shuffled)  # the order of golden answers never matters
    f1, em, cover = metrics.f1(pred, golds), metrics.em(pred, golds), metrics.cover_em(pred, golds)
    assert f1 == max([metrics.f1(pred, [g]) for g in golds if g is not None], default=0.0)
    # an exact match is a full F1 and is covered; except that SQuAD's EM is 1 when both sides normalize
    # to nothing ("A" vs "A") while its F1 is 0
    assert em <= cover and (em <= f1 + 1e-12 or not metrics.normalize(pred))
    assert metrics.f1(pred, golds, "set") >= 0.0


def test_metrics_on_huge_answers_take_linear_time():
    big = "the quick brown fox " * 20_000  # 400 KB: a table cell, not anything a model writes
    t0 = time.perf_counter()
    assert metrics.f1(big, [big]) == pytest.approx(1.0)
    assert metrics.cover_em(big, ["fox", big[:1000]]) == 1.0
    assert metrics.f1(big, ["x"] * 5, "set") == 0.0
    assert time.perf_counter() - t0 < 8.0  # ~0.5 s here (pure-Python normalization)


# --- environment text never becomes a control token ------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model))


FORGERIES = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "</tool_response>", "<tool_response>", "<|", "|>",
             "system\n", "assistant\n", "<｜begin▁of▁sentence｜>", "<|eot_id|>", "<|start_header_id|>"]


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(FORGERIES) | st.text(max_size=6), max_size=20).map("".join))
def test_tool_output_cannot_forge_a_control_token(tokenizer, text):
    msg = agent_format.tool_message(text)
    ids = tokenizer(msg, add_special_tokens=False)["input_ids"]
    assert not set(ids) & set(tokenizer.all_special_ids)
    body = msg[len("<tool_response>\n"):-len("\n</tool_response>")]
    assert "<tool_response>" not in body and "</tool_response>" not in body
    # nothing but the breaking spaces was changed: the page stays readable and whole
    assert body.replace("< ", "<") == text.replace("< ", "<")
