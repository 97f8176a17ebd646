"""The real-text expert (`atomcli.demo.real_sft`) and the kit it shares with the demo expert
(`atomcli.demo.expert_kit`): rows that pass the SFT checks, answers copied from what the tools returned,
queries built from the question, the train split only, rivals and quotes cut at the answer.
Data-level checks only: no model is loaded."""

from __future__ import annotations

import json
import re

import pytest

from atomcli.agent import format as agent_format
from atomcli.context import Context
from atomcli.demo import expert_kit, real_docs, real_sft
from atomcli.rewards import metrics

SEED = 5


@pytest.fixture(scope="module")
def rows():
    out, dropped = real_sft.trajectories("sqlite", seed=SEED, context=Context(quiet=True))
    assert len(out) >= 200 and dropped < len(out)
    return out


def observations(r):
    return [m["content"] for m in r["messages"] if m["role"] == "tool"]


def queries(r):
    return [q for c in r["tool_calls"] if c["name"] == "web_search" for q in json.loads(c["arguments"])["query"]]


def test_rows_pass_the_sft_format_checks(rows):
    for r in rows:
        assert r["format_ok"] and agent_format.trajectory_format_ok(r["messages"])
        assert r["finish_reason"] == "answer" and r["policy"] == expert_kit.POLICY
        roles = [m["role"] for m in r["messages"][2:]]
        assert roles == ["assistant", "tool"] * (len(roles) // 2) + ["assistant"]
        assert r["n_turns"] == len(r["tool_calls"]) + 1 == roles.count("assistant")
        assert agent_format.extract_answer(r["messages"][-1]["content"]) == r["answer"]
        assert metrics.f1(r["answer"], r["golden_answers"]) == 1.0
        assert all(c["ok"] for c in r["tool_calls"])


def test_every_answer_was_received_from_a_tool(rows):
    """No invented facts: the answer is a span of an observation the trajectory received."""
    for r in rows:
        pat = expert_kit.value_pattern(r["answer"])
        assert any(pat.search(o) for o in observations(r)), (r["id"], r["answer"])


def test_queries_are_built_from_the_question_and_never_repeated(rows):
    for r in rows:
        terms = {t.lower() for t in expert_kit.key_terms(r["question"])}
        first = expert_kit.key_terms(queries(r)[0])
        assert first and sum(t.lower() in terms for t in first) >= 0.5 * len(first), (r["question"], queries(r)[0])
        assert len(queries(r)) == len({q.lower() for q in queries(r)})


def test_only_train_questions_never_a_test_one(rows):
    _, questions = real_docs.load("sqlite")
    train = {q["id"]: q["question"] for q in questions if q["split"] == "train"}
    test = {q["id"]: q["question"] for q in questions if q["split"] == "test"}
    assert all(r["id"] in train and r["question"] == train[r["id"]] for r in rows)
    assert not {r["id"] for r in rows} & set(test)
    assert not {r["question"] for r in rows} & set(test.values())
    assert {r["data_source"] for r in rows} == {"sqlite_1hop", "sqlite_2hop"}


def test_observations_are_what_the_real_tools_return(rows, tmp_path):
    from atomcli.env.tools import ToolBox
    real_docs.build("sqlite", tmp_path / "real")
    tb = ToolBox("local:" + str(tmp_path / "real" / "index.sqlite"), Context(quiet=True), k=expert_kit.SFT_K)
    try:
        for r in rows[:12]:
            calls = [m["content"] for m in r["messages"] if m["role"] == "assistant"][:-1]
            for text, recorded in zip(calls, observations(r)):
                call = agent_format.parse_tool_call(agent_format.TOOL_RE.findall(text)[-1])
                assert agent_format.tool_message(tb.run(call, r["traj_id"]).observation) == recorded
            tb.forget(r["traj_id"])
    finally:
        tb.close()


def test_the_real_expert_sets_a_tempting_rival_against_the_answers_sentence():
    """A page that states two values of one kind is read by naming what tells them apart."""
    obs = ('Results for "largest value SQLITE_MAX_COLUMN":\n'
           "1. Implementation Limits For SQLite: Maximum Number Of Columns\n   url: local://doc/sqlite%2Flimits%234\n"
           "   …The default setting for SQLITE_MAX_COLUMN is 2000. You can change it at compile time to values as "
           "large as 32767. Most designers need far fewer…\n")
    terms = expert_kit.key_terms("To what largest value can SQLITE_MAX_COLUMN be raised at compile time?")
    said = expert_kit.quote(obs, "32767", terms)
    # ("value" is in "values": the match is the plain substring the quote's choice also uses)
    assert real_sft.rival(obs, "32767", said, terms) == ("The default setting for SQLITE_MAX_COLUMN is 2000",
                                                         "value compile time")
    # read the other way round, the other sentence is the rival and the question's own words decide
    terms = expert_kit.key_terms("What is the default value of SQLITE_MAX_COLUMN?")
    said = expert_kit.quote(obs, "2000", terms)
    other, cue = real_sft.rival(obs, "2000", said, terms)
    assert "32767" in other and "2000" not in other and cue == "default SQLITE_MAX_COLUMN"
    # a sentence with none of the question's words is no temptation
    assert real_sft.rival(obs, "2000", said, ["default", "SQLITE_MAX_COLUMN"]) is None
    # no rival: an answer of a kind no other sentence states (a word), a question word that does not separate them
    assert real_sft.rival(obs, "designers", "Most designers need far fewer", ["designers"]) is None
    assert real_sft.rival(obs, "32767", said, ["SQLITE_MAX_COLUMN"]) is None


def test_rows_that_name_a_rival_quote_both_sentences_and_answer_from_the_second(rows):
    pair = re.compile(r'[^"]*"(?P<rival>[^"]+)"[^"]*?"(?P<quote>.+)"\.')  # a rival is never quoted with quotes in it
    cues = ("asks about ", "is about ", "question says ")
    seen = 0
    for r in rows:
        thoughts = agent_format.atomic_thoughts(r["messages"][-1]["content"])
        if not (len(thoughts) == 2 and any(c in thoughts[1][1] for c in cues)):
            continue
        assert thoughts[0][0] == "OBSERVATION"
        said = pair.fullmatch(thoughts[0][1])
        seen += 1
        before = " ".join(r["messages"][-2]["content"].split())
        assert said["rival"] in before and said["quote"] in before              # both copied from the results
        gold = expert_kit.value_pattern(r["answer"])
        assert gold.search(said["quote"]) and not gold.search(said["rival"])
        tag, why = thoughts[1]
        assert tag == "REFLECTION" and why.rstrip(".").endswith(r["answer"])
        cue = next(c for c in cues if c in why)
        words = re.split(r",|;", why.split(cue)[1])[0].split()
        assert words and all(w.lower() in r["question"].lower() and w.lower() in said["quote"].lower()
                             and w.lower() not in said["rival"].lower() for w in words), (why, said.groupdict())
    assert seen >= 5


def test_a_quote_cut_at_its_value_ends_with_the_answer():
    """The real expert's quote stops just after the answer, so the answer is the words it just wrote."""
    text = ("The default setting for SQLITE_MAX_COLUMN is 2000. You can change it at compile time to values as "
            "large as 32767. Most designers need far fewer.")
    terms = ["compile", "time", "SQLITE_MAX_COLUMN"]
    assert expert_kit.quote(text, "32767", terms) == "You can change it at compile time to values as large as 32767"
    assert expert_kit.quote(text, "2000", terms, end_at_value=True) == "The default setting for SQLITE_MAX_COLUMN is 2000"
    # the words after the value are dropped, and a long head keeps its last max_words words
    text = "Each one of the many quick brown foxes jumps over the 12 lazy dogs every day."
    assert expert_kit.quote(text, "12", end_at_value=True) == "Each one of the many quick brown foxes jumps over the 12"
    assert expert_kit.quote(text, "12", max_words=4, end_at_value=True) == "jumps over the 12"
    # a value in the sentence's first words keeps the whole sentence: a two-word quote is no sentence to read
    assert expert_kit.quote("32767 is the largest. Other text.", "32767", end_at_value=True) == "32767 is the largest"
    assert expert_kit.quote(text, "99", end_at_value=True) is None


def test_rows_quote_up_to_the_answer(rows):
    ends = 0
    for r in rows:
        unit = dict(agent_format.atomic_thoughts(r["messages"][-1]["content"]))["OBSERVATION"]
        said = unit[:unit.rindex('"')]  # up to the closing mark of the last quote (a sentence may hold quotes itself)
        assert expert_kit.value_pattern(r["answer"]).search(said), (unit, r["answer"])
        ends += said.endswith(r["answer"])
    # the rest are answers in their sentence's first words (the unit test above), where the sentence is kept whole
    assert ends >= 0.6 * len(rows), (ends, len(rows))
