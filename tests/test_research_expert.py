"""The research style of the demo world (issue 20): a world that needs reading, an expert that
researches instead of filling a template, and an SFT mix with the real benchmark's train split.
Data-level checks only: no model is loaded."""

from __future__ import annotations

import json
import re
from collections import Counter

import pyarrow.parquet as pq
import pytest
from conftest import atom

from atomcli import schema
from atomcli.agent import format as agent_format
from atomcli.context import Context
from atomcli.demo import real_docs, research_expert, research_world
from atomcli.demo import world as demo_world
from atomcli.errors import InputError
from atomcli.rewards import metrics

SEED = 5


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def research_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("research") / "world"
    summary = demo_world.main(str(out), seed=SEED, articles=600, train=120, test=30, sft=80, style="research",
                              context=Context(quiet=True))
    assert summary["sft_demo"] == 80 and summary["sft_real"] >= 40
    return out


@pytest.fixture(scope="module")
def rows(research_dir):
    return pq.read_table(research_dir / "sft.parquet").to_pylist()


def demo_rows(rows):
    return [r for r in rows if r["data_source"].startswith("demo_")]


def assistant_units(r):
    return [u for m in r["messages"] if m["role"] == "assistant" for u in agent_format.atomic_thoughts(m["content"])]


def observations(r):
    return [m["content"] for m in r["messages"] if m["role"] == "tool"]


def queries(r):
    return [q for c in r["tool_calls"] if c["name"] == "web_search" for q in json.loads(c["arguments"])["query"]]


def test_rows_pass_the_sft_format_checks(research_dir, rows):
    table = pq.read_table(research_dir / "sft.parquet")
    schema.require(table, "sft", "sft.parquet")
    for name in table.column_names:
        assert table.schema.field(name).type == schema.COLUMNS[name].type, name
    for r in rows:
        assert r["format_ok"] and agent_format.trajectory_format_ok(r["messages"])
        assert r["finish_reason"] == "answer" and r["policy"] == research_expert.POLICY
        roles = [m["role"] for m in r["messages"][2:]]
        assert roles == ["assistant", "tool"] * (len(roles) // 2) + ["assistant"]
        assert r["n_turns"] == len(r["tool_calls"]) + 1 == roles.count("assistant")
        assert agent_format.extract_answer(r["messages"][-1]["content"]) == r["answer"]
        assert metrics.f1(r["answer"], r["golden_answers"]) == 1.0
        assert all(c["ok"] for c in r["tool_calls"])
    config = schema.provenance(table)[-1]["config"]
    assert config["style"] == "research" and config["real"] == "sqlite"


def test_every_answer_was_received_from_a_tool(rows):
    """No invented facts: the answer is a span of an observation the trajectory received."""
    for r in rows:
        pat = research_expert.value_pattern(r["answer"])
        assert any(pat.search(o) for o in observations(r)), (r["id"], r["answer"])


def test_thoughts_and_queries_are_varied_and_built_from_the_question(rows):
    firsts = [assistant_units(r)[0] for r in rows]
    assert all(tag == "PLAN" for tag, _ in firsts)
    # the template of each first plan: its words that are neither in the question nor in any observation
    skeletons = Counter()
    for r, (_, text) in zip(rows, firsts):
        known = set(re.findall(r"\w+", (r["question"] + " ".join(observations(r))).lower()))
        skeletons[" ".join(w for w in re.findall(r"\w+", text.lower()) if w not in known)] += 1
    assert len(skeletons) >= 6 and max(skeletons.values()) < 0.4 * len(rows), skeletons.most_common(3)
    all_units = [text for r in rows for _, text in assistant_units(r)]
    assert len(set(all_units)) > 0.6 * len(all_units)
    for stale in ("-hop question", "links", "lookups"):  # the classic expert's counting phrases
        # (a real question's own word, "Software that links against ...", listed among its key terms is not one)
        assert not any(stale in text and stale not in r["question"] for r in rows for _, text in assistant_units(r)), stale
    for r in rows:  # the first query is made of the question's own words
        terms = {t.lower() for t in research_expert.key_terms(r["question"])}
        first = research_expert.key_terms(queries(r)[0])
        assert first and sum(t.lower() in terms for t in first) >= 0.5 * len(first), (r["question"], queries(r)[0])
        assert len(queries(r)) == len({q.lower() for q in queries(r)})       # never the same query twice


def test_some_trajectories_rewrite_a_failed_query_and_browse_a_cut_snippet(rows):
    rewrites = browses = 0
    for r in rows:
        tags = [tag for tag, _ in assistant_units(r)]
        calls = [c["name"] for c in r["tool_calls"]]
        for i, c in enumerate(calls[:-1]):
            if c == "web_search" and calls[i + 1] == "web_search":
                turn = agent_format.atomic_thoughts([m["content"] for m in r["messages"]
                                                     if m["role"] == "assistant"][i + 1])
                if any(t == "REFLECTION" for t, _ in turn):
                    rewrites += 1
        browses += calls.count("browse_webpage")
        assert tags
    assert rewrites >= 5 and browses >= 20


def test_browsing_happens_when_the_snippet_lacks_the_fact(rows):
    """Every browse follows a search whose results did not show the fact the next thought quotes."""
    seen = 0
    for r in demo_rows(rows):
        msgs = r["messages"]
        for k, m in enumerate(msgs):
            if m["role"] == "assistant" and '"browse_webpage"' in m["content"]:
                snippet_obs, page = msgs[k - 1]["content"], msgs[k + 1]["content"]
                said = next(x for _, x in agent_format.atomic_thoughts(msgs[k + 2]["content"]) if '"' in x)
                quote = re.search(r'"(.+)"', said).group(1)
                assert quote in " ".join(page.split()) and quote not in " ".join(snippet_obs.split())
                seen += 1
    assert seen >= 10


def test_the_mix_has_real_train_questions_and_never_a_real_test_one(rows):
    _, questions = real_docs.load("sqlite")
    train = {q["id"]: q["question"] for q in questions if q["split"] == "train"}
    test = {q["id"]: q["question"] for q in questions if q["split"] == "test"}
    real = [r for r in rows if r["data_source"].startswith("sqlite_")]
    assert len(real) >= 40 and len(demo_rows(rows)) == 80 and len(real) + len(demo_rows(rows)) == len(rows)
    assert all(r["id"] in train and r["question"] == train[r["id"]] for r in real)
    assert not {r["id"] for r in rows} & set(test)
    assert not {r["question"] for r in rows} & set(test.values())
    assert {r["data_source"] for r in real} == {"sqlite_1hop", "sqlite_2hop"}
    sources = [r["data_source"][:4] for r in rows[:40]]
    assert "demo" in sources and "sqli" in sources                         # interleaved, not two blocks


def test_real_observations_are_what_the_real_tools_return(rows, tmp_path):
    from atomcli.env.tools import ToolBox
    real_docs.build("sqlite", tmp_path / "real")
    tb = ToolBox("local:" + str(tmp_path / "real" / "index.sqlite"), Context(quiet=True), k=demo_world.SFT_K)
    try:
        for r in [r for r in rows if r["data_source"].startswith("sqlite_")][:12]:
            calls = [m["content"] for m in r["messages"] if m["role"] == "assistant"][:-1]
            for text, recorded in zip(calls, observations(r)):
                call = agent_format.parse_tool_call(agent_format.TOOL_RE.findall(text)[-1])
                assert agent_format.tool_message(tb.run(call, r["traj_id"]).observation) == recorded
            tb.forget(r["traj_id"])
    finally:
        tb.close()


def test_the_real_benchmarks_train_split_is_in_the_rl_world_and_its_test_split_is_not(research_dir):
    """RL steps draw real train questions and find their passages through the world's own index."""
    corpus, questions = real_docs.load("sqlite")
    real_train = [q for q in questions if q["split"] == "train"]
    real_test = {q["id"] for q in questions if q["split"] == "test"}
    train = read_jsonl(research_dir / "train.jsonl")
    ids = [q["id"] for q in train]
    assert [q["id"] for q in real_train] == ids[-len(real_train):] and not real_test & set(ids)
    assert all(set(q) == {"id", "question", "golden_answers", "data_source"} for q in train)
    assert {q["data_source"] for q in train[-len(real_train):]} == {"sqlite_1hop", "sqlite_2hop"}
    docs = read_jsonl(research_dir / "corpus.jsonl")
    assert sum(d["id"].startswith("sqlite/") for d in docs) == len(corpus)
    from atomcli.env import search_local
    q = real_train[0]  # its support passage is found in the world's index
    hits = search_local.LocalIndex(str(research_dir / "index.sqlite")).search(q["question"], k=10)
    assert set(q["support"]) & {h["id"] for h in hits}


def test_the_research_world_has_namesakes_and_pages_that_need_reading(research_dir):
    docs = [d for d in read_jsonl(research_dir / "corpus.jsonl") if not d["id"].startswith("sqlite/")]
    titles = [d["title"] for d in docs]
    assert len(set(titles)) == len(titles)
    people = [d["title"] for d in docs if d["id"].startswith("person")]
    surnames = Counter(t.split()[-1] for t in people)
    assert sum(n > 1 for n in surnames.values()) >= 10                   # people who share a surname
    firsts = Counter(d["title"].split()[0] for d in docs if d["id"].startswith(("org", "work")))
    assert sum(n > 1 for n in firsts.values()) >= 10                     # "Orlenic Press" / "Orlenic Editions"
    assert sum("should not be confused with" in d["contents"] for d in docs) >= 20
    words = sorted(len(d["contents"].split()) for d in docs)
    assert words[len(words) // 2] >= 70                                  # longer than a 48-token snippet
    world = research_world.build(SEED, 600)
    _, spans = research_world.render(world, SEED)
    phrasings = Counter(re.sub(r"[A-Z]\w+|\d+", "_", s) for (e, rel), s in spans.items() if rel == "mentor")
    assert len(phrasings) >= 3                                           # one relation, several wordings


def test_research_world_is_reproducible_and_its_questions_are_flashrag(tmp_path):
    args = ["--articles", "200", "--train", "20", "--test", "6", "--sft", "4", "--style", "research"]
    for name in ("a", "b"):
        proc = atom("demo-world", "--out", tmp_path / name, "--seed", 2, *args)
        assert proc.returncode == 0, proc.stderr.decode()
    for f in demo_world.FILES:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    train, test = read_jsonl(tmp_path / "a" / "train.jsonl"), read_jsonl(tmp_path / "a" / "test.jsonl")
    assert all(set(q) == {"id", "question", "golden_answers", "data_source"} for q in train + test)
    assert not {q["question"] for q in train} & {q["question"] for q in test}


def test_an_unknown_style_lists_the_valid_ones(tmp_path):
    with pytest.raises(InputError) as e:
        demo_world.main(str(tmp_path / "w"), style="fancy")
    assert "classic" in e.value.hint and "research" in e.value.hint
    proc = atom("demo-world", "--out", tmp_path / "w", "--style", "fancy")
    assert proc.returncode == 2 and b"research" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_the_real_expert_sets_a_tempting_rival_against_the_answers_sentence():
    """Session 32: a page that states two values of one kind is read by naming what tells them apart."""
    from atomcli.demo import real_sft
    obs = ('Results for "largest value SQLITE_MAX_COLUMN":\n'
           "1. Implementation Limits For SQLite: Maximum Number Of Columns\n   url: local://doc/sqlite%2Flimits%234\n"
           "   …The default setting for SQLITE_MAX_COLUMN is 2000. You can change it at compile time to values as "
           "large as 32767. Most designers need far fewer…\n")
    terms = research_expert.key_terms("To what largest value can SQLITE_MAX_COLUMN be raised at compile time?")
    said = research_expert.quote(obs, "32767", terms)
    # ("value" is in "values": the match is the plain substring the quote's choice also uses)
    assert real_sft.rival(obs, "32767", said, terms) == ("The default setting for SQLITE_MAX_COLUMN is 2000",
                                                         "value compile time")
    # read the other way round, the other sentence is the rival and the question's own words decide
    terms = research_expert.key_terms("What is the default value of SQLITE_MAX_COLUMN?")
    said = research_expert.quote(obs, "2000", terms)
    other, cue = real_sft.rival(obs, "2000", said, terms)
    assert "32767" in other and "2000" not in other and cue == "default SQLITE_MAX_COLUMN"
    # a sentence with none of the question's words is no temptation
    assert real_sft.rival(obs, "2000", said, ["default", "SQLITE_MAX_COLUMN"]) is None
    # no rival: an answer of a kind no other sentence states (a word), a question word that does not separate them
    assert real_sft.rival(obs, "designers", "Most designers need far fewer", ["designers"]) is None
    assert real_sft.rival(obs, "32767", said, ["SQLITE_MAX_COLUMN"]) is None


def test_real_rows_that_name_a_rival_quote_both_sentences_and_answer_from_the_second(rows):
    pair = re.compile(r'[^"]*"(?P<rival>[^"]+)"[^"]*?"(?P<quote>.+)"\.')  # a rival is never quoted with quotes in it
    cues = ("asks about ", "is about ", "question says ")
    seen = 0
    for r in [r for r in rows if r["data_source"].startswith("sqlite_")]:
        thoughts = agent_format.atomic_thoughts(r["messages"][-1]["content"])
        if not (len(thoughts) == 2 and any(c in thoughts[1][1] for c in cues)):
            continue
        assert thoughts[0][0] == "OBSERVATION"
        said = pair.fullmatch(thoughts[0][1])
        seen += 1
        before = " ".join(r["messages"][-2]["content"].split())
        assert said["rival"] in before and said["quote"] in before              # both copied from the results
        gold = research_expert.value_pattern(r["answer"])
        assert gold.search(said["quote"]) and not gold.search(said["rival"])
        tag, why = thoughts[1]
        assert tag == "REFLECTION" and why.rstrip(".").endswith(r["answer"])
        cue = next(c for c in cues if c in why)
        words = re.split(r",|;", why.split(cue)[1])[0].split()
        assert words and all(w.lower() in r["question"].lower() and w.lower() in said["quote"].lower()
                             and w.lower() not in said["rival"].lower() for w in words), (why, said.groupdict())
    assert seen >= 5


def test_a_quote_cut_at_its_value_ends_with_the_answer():
    """Session 33: the real expert's quote stops just after the answer, so the answer is the words it just wrote."""
    text = ("The default setting for SQLITE_MAX_COLUMN is 2000. You can change it at compile time to values as "
            "large as 32767. Most designers need far fewer.")
    terms = ["compile", "time", "SQLITE_MAX_COLUMN"]
    assert research_expert.quote(text, "32767", terms) == "You can change it at compile time to values as large as 32767"
    assert research_expert.quote(text, "2000", terms, end_at_value=True) == "The default setting for SQLITE_MAX_COLUMN is 2000"
    # the words after the value are dropped, and a long head keeps its last max_words words
    text = "Each one of the many quick brown foxes jumps over the 12 lazy dogs every day."
    assert research_expert.quote(text, "12", end_at_value=True) == "Each one of the many quick brown foxes jumps over the 12"
    assert research_expert.quote(text, "12", max_words=4, end_at_value=True) == "jumps over the 12"
    # a value in the sentence's first words keeps the whole sentence: a two-word quote is no sentence to read
    assert research_expert.quote("32767 is the largest. Other text.", "32767", end_at_value=True) == "32767 is the largest"
    assert research_expert.quote(text, "99", end_at_value=True) is None


def test_real_rows_quote_up_to_the_answer(rows):
    real = [r for r in rows if r["data_source"].startswith("sqlite_")]
    ends = 0
    for r in real:
        unit = dict(agent_format.atomic_thoughts(r["messages"][-1]["content"]))["OBSERVATION"]
        said = unit[:unit.rindex('"')]  # up to the closing mark of the last quote (a sentence may hold quotes itself)
        assert research_expert.value_pattern(r["answer"]).search(said), (unit, r["answer"])
        ends += said.endswith(r["answer"])
    # the rest are answers in their sentence's first words (the unit test above), where the sentence is kept whole
    assert ends >= 0.6 * len(real), (ends, len(real))
