"""The demo research world: reproducible files, answerable-only-by-search questions, and an
SFT set written by a scripted expert that really uses the tools."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections import Counter

import pyarrow.parquet as pq
import pytest
from conftest import atom

from atomcli import schema
from atomcli.agent import format as agent_format
from atomcli.agent.format import parse_tool_call
from atomcli.context import Context
from atomcli.demo import generate, pages
from atomcli.demo import world as demo_world
from atomcli.demo.expert import REWRITTEN, Expert
from atomcli.env.tools import ToolBox
from atomcli.errors import InputError
from atomcli.rewards import metrics

SEED = 7


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    """The default-size world (2,400 articles, 400/100 questions), SFT trimmed to keep tests quick."""
    out = tmp_path_factory.mktemp("world") / "demo"
    summary = demo_world.main(str(out), seed=SEED, sft=40, context=Context(quiet=True))
    assert summary["sft"] == 40
    return out


def test_same_seed_same_bytes_and_another_seed_differs(tmp_path):
    args = ["--articles", "300", "--train", "40", "--test", "12", "--sft", "8"]
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        proc = atom("demo-world", "--out", tmp_path / name, "--seed", seed, *args)
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stdout == b""
    for f in demo_world.FILES:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() != (tmp_path / "c" / "corpus.jsonl").read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == sorted(demo_world.FILES)


def test_corpus_is_an_invented_encyclopedia(world_dir):
    docs = read_jsonl(world_dir / "corpus.jsonl")
    assert len(docs) >= 2000
    assert all(set(d) == {"id", "title", "contents"} for d in docs)
    titles = [d["title"] for d in docs]
    assert len(set(titles)) == len(titles)                      # every name is its own search key
    kinds = Counter(d["id"].split("-")[0] for d in docs)
    assert set(kinds) == {"country", "city", "person", "org", "work"} and min(kinds.values()) >= 10
    text = " ".join(d["contents"] for d in docs)
    for relation_phrase in ("was born in", "founded", "studied under", "capital is", "published by", "premiered by"):
        assert relation_phrase in text


def test_questions_are_flashrag_with_hop_sources_and_disjoint_splits(world_dir):
    train, test = read_jsonl(world_dir / "train.jsonl"), read_jsonl(world_dir / "test.jsonl")
    assert (len(train), len(test)) == (400, 100)
    for q in train + test:
        assert set(q) == {"id", "question", "golden_answers", "data_source"}
        assert q["golden_answers"] and all(isinstance(a, str) and a for a in q["golden_answers"])
        assert q["question"].endswith("?")
    assert {q["data_source"] for q in test} == {"demo_1hop", "demo_2hop", "demo_3hop", "demo_4hop"}
    assert not {q["question"] for q in train} & {q["question"] for q in test}
    assert len({q["id"] for q in train + test}) == 500
    words = {h: [len(q["question"].split()) for q in train + test if q["data_source"] == f"demo_{h}hop"]
             for h in (1, 2, 3, 4)}
    means = [sum(w) / len(w) for w in words.values()]
    assert means == sorted(means) and means[3] > means[0] + 6      # each hop nests one more description
    aliases = [q for q in train if len(q["golden_answers"]) > 1]
    assert aliases, "people and countries carry aliases"


def test_sft_rows_follow_the_trajectory_contract(world_dir):
    table = pq.read_table(world_dir / "sft.parquet")
    for name in table.column_names:
        assert table.schema.field(name).type == schema.COLUMNS[name].type, name
    schema.require(table, "sft", "sft.parquet")
    rows = table.to_pylist()
    train_ids = {q["id"] for q in read_jsonl(world_dir / "train.jsonl")}
    system = agent_format.system_prompt(date="2026-01-01")
    for r in rows:
        assert r["id"] in train_ids                                   # never a test question
        assert r["policy"] == "scripted-expert" and r["finish_reason"] == "answer" and r["format_ok"]
        assert agent_format.trajectory_format_ok(r["messages"])
        assert r["traj_id"] == f"{r['group_id']}/{r['sample_idx']}"
        msgs = r["messages"]
        assert msgs[0] == {"role": "system", "content": system}
        assert msgs[1] == {"role": "user", "content": agent_format.user_message(r["question"])}
        roles = [m["role"] for m in msgs[2:]]
        assert roles == ["assistant", "tool"] * (len(roles) // 2) + ["assistant"]
        assert all(m["content"].startswith("<tool_response>") for m in msgs if m["role"] == "tool")
        assert r["n_turns"] == roles.count("assistant") == len(r["tool_calls"]) + 1
        assert r["n_search"] + r["n_browse"] == len(r["tool_calls"])
        assert r["n_search"] >= int(r["data_source"][5])            # at least one search per hop
        assert metrics.f1(r["answer"], r["golden_answers"]) == 1.0
        assert agent_format.extract_answer(msgs[-1]["content"]) == r["answer"]
    tags = Counter(t for r in rows for m in r["messages"] if m["role"] == "assistant"
                   for t, _ in agent_format.atomic_thoughts(m["content"]))
    assert {"OBSERVATION", "PLAN", "ACTION", "REFLECTION"} <= set(tags) and len(tags) >= 6
    assert sum(r["n_browse"] for r in rows) > 0                        # some snippets stop short of the fact
    prov = schema.provenance(table)
    assert prov[-1]["stage"] == "demo-world" and prov[-1]["config"]["k"] == demo_world.SFT_K


def test_sft_observations_are_what_the_toolbox_returns(world_dir):
    """Replaying every recorded call through a fresh ToolBox gives the same tool messages, byte for byte."""
    rows = pq.read_table(world_dir / "sft.parquet").to_pylist()[:15]
    tb = ToolBox("local:" + str(world_dir / "index.sqlite"), Context(quiet=True), k=demo_world.SFT_K)
    try:
        for r in rows:
            tool_msgs = [m["content"] for m in r["messages"] if m["role"] == "tool"]
            calls = [m["content"] for m in r["messages"] if m["role"] == "assistant"][:-1]
            for text, recorded in zip(calls, tool_msgs):
                call = parse_tool_call(agent_format.TOOL_RE.findall(text)[-1])
                assert call.error is None
                assert agent_format.tool_message(tb.run(call, r["traj_id"]).observation) == recorded
            tb.forget(r["traj_id"])
    finally:
        tb.close()


def test_scripted_expert_answers_the_test_split(world_dir):
    """The expert, searching for itself, scores F1 >= 0.95 on test.jsonl (the world is solvable)."""
    world, _train, test_q = generate.generate(SEED, 2400, 400, 100)
    plans = {q.id: q for q in test_q}
    test = read_jsonl(world_dir / "test.jsonl")
    assert [q["question"] for q in test] == [plans[q["id"]].question for q in test]
    tb = ToolBox("local:" + str(world_dir / "index.sqlite"), Context(quiet=True), k=demo_world.SFT_K)
    try:
        expert = Expert(tb, world, SEED)
        rows = [expert.solve(plans[q["id"]]) for q in test]
    finally:
        tb.close()
    scores = [metrics.f1(r["answer"], q["golden_answers"]) for r, q in zip(rows, test)]
    assert sum(scores) / len(scores) >= 0.95
    assert all(r["format_ok"] for r in rows)


def test_bad_arguments_exit_2_and_leave_other_folders_alone(tmp_path):
    proc = atom("demo-world", "--out", tmp_path / "w", "--train", "5", "--sft", "6")
    assert proc.returncode == 2 and b"train split" in proc.stderr
    proc = atom("demo-world", "--out", tmp_path / "w", "--articles", "10")
    assert proc.returncode == 2 and b"--articles" in proc.stderr
    assert not (tmp_path / "w").exists()
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    proc = atom("demo-world", "--out", keep, "--articles", "120", "--train", "4", "--test", "2", "--sft", "1")
    assert proc.returncode == 2 and b"refusing" in proc.stderr
    assert (keep / "notes.txt").read_text() == "precious"


def test_an_unknown_style_lists_the_valid_ones(tmp_path):
    with pytest.raises(InputError) as e:
        demo_world.main(str(tmp_path / "w"), style="research")
    assert e.value.hint.endswith("classic, stepwise, stepwise-real")
    proc = atom("demo-world", "--out", tmp_path / "w", "--style", "fancy")
    assert proc.returncode == 2 and b"stepwise-real" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_served_pages_can_be_browsed_over_http(world_dir):
    server, base = pages.serve(str(world_dir / "corpus.jsonl"))
    try:
        doc = next(d for d in read_jsonl(world_dir / "corpus.jsonl") if d["id"].startswith("person"))
        with urllib.request.urlopen(f"{base}/doc/{doc['id']}", timeout=10) as resp:
            page = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("text/html")
        assert f"<title>{doc['title']}</title>" in page
        assert doc["contents"].split(".")[1].strip() in page
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/doc/nope", timeout=10)
        assert e.value.code == 404
        # the agent's browse tool, over real HTTP through the SSRF guard (loopback explicitly allowed)
        tb = ToolBox("", Context(quiet=True), allow_hosts="127.0.0.1")
        try:
            born = re.search(r"born in [^.]+\.", doc["contents"]).group(0)
            call = parse_tool_call(json.dumps({"name": "browse_webpage", "arguments": {
                "url_list": [f"{base}/doc/{doc['id']}"], "query": f"where was {doc['title']} born"}}))
            res = tb.run(call, "t")
            assert res.ok, res.observation
            assert born in res.observation
        finally:
            tb.close()
    finally:
        server.shutdown()


@pytest.mark.slow
def test_smollm2_without_tools_cannot_answer(world_dir):
    """The facts are invented: the demo model asked directly scores F1 <= 0.10 (24 test questions)."""
    import torch

    from atomcli import models
    test = read_jsonl(world_dir / "test.jsonl")[:24]
    model, tok = models.load("smollm2", Context(quiet=True))
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Answer with a short phrase only.\n"
                                         f"Question: {q['question']}"}], tokenize=False, add_generation_prompt=True)
               for q in test]
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    preds = [t.strip().split("\n")[0] for t in tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)]
    assert all(preds), "the model produced text"
    f1 = sum(metrics.f1(p, q["golden_answers"]) for p, q in zip(preds, test)) / len(test)
    assert f1 <= 0.10, (f1, preds[:5])


def test_stepwise_style_is_the_classic_world_with_an_expert_that_rewrites_the_question(tmp_path):
    """style "stepwise": the classic world's files (same bytes), and an SFT set whose plans name no hop count;
    after every fact but the last the expert restates the question with that fact in place (a question the
    rewritten one is), and after the last it says the fact answers it, then answers."""
    out = tmp_path / "stepwise"
    summary = demo_world.main(str(out), seed=0, style="stepwise", sft=60, context=Context(quiet=True))
    assert summary["sft"] == 60
    classic = demo_world.main(str(tmp_path / "classic"), seed=0, sft=20, context=Context(quiet=True))
    assert classic["sft"] == 20
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (tmp_path / "classic" / name).read_bytes(), name
    table = pq.read_table(out / "sft.parquet")
    assert schema.provenance(table)[-1]["config"]["style"] == "stepwise"
    world, train_q, _ = generate.generate(0, 2400, 400, 100)
    by_id = {q.id: q for q in train_q}
    hops_seen = Counter()
    for r in table.to_pylist():
        q = by_id[r["id"]]
        h = len(q.chain)
        hops_seen[h] += 1
        turns = [m["content"] for m in r["messages"] if m["role"] == "assistant"]
        text = "".join(turns)
        assert not re.search(r"\d+-hop|\d+ lookups|\d+ links", text)            # no count anywhere
        reflections = [x for t in turns for tag, x in agent_format.atomic_thoughts(t) if tag == "REFLECTION"]
        rewrites = [x for x in reflections if any(x.startswith(p.split("{")[0]) and "?" in x
                                                  for p in REWRITTEN)]
        assert len(rewrites) == h - 1, (r["question"], reflections)
        descs = generate.question_descs(q, world)
        names = [str(v) if isinstance(v, int) else world.get(v).name for v in q.path]
        for i, x in enumerate(rewrites):   # hop i's value in place of the description it resolves
            assert x.endswith(q.question.replace(descs[i + 1], names[i + 1], 1))
        assert names[-1] in reflections[-1] and reflections[-1] not in rewrites
        assert metrics.f1(r["answer"], r["golden_answers"]) == 1.0 and r["format_ok"]
    assert set(hops_seen) == {1, 2, 3, 4}
    # the classic expert still names counts
    text = "".join(m["content"] for r in pq.read_table(tmp_path / "classic" / "sft.parquet").to_pylist()
                   for m in r["messages"] if m["role"] == "assistant")
    assert re.search(r"\d+-hop|\d+ lookups|\d+ links", text)


def test_every_question_of_the_world_is_recovered_as_nested_descriptions():
    """question_descs finds, for every generated question, one description per inner relation."""
    world, train_q, test_q = generate.generate(0, 2400, 400, 100)
    for q in train_q + test_q:
        descs = generate.question_descs(q, world)
        assert len(descs) == len(q.chain) and descs[-1] in q.question
        assert all(d in q.question for d in descs)


def test_stepwise_real_mixes_the_real_benchmarks_train_part_into_corpus_questions_and_sft(tmp_path, tiny_model):
    """style "stepwise-real": the stepwise world plus the real benchmark's passages (one index for both), its
    train split after the demo's train questions, and real-text expert trajectories shuffled into the SFT set;
    never a test question of the real benchmark."""
    from atomcli.demo import real_docs
    out = tmp_path / "mixed"
    summary = demo_world.main(str(out), seed=0, articles=300, train=60, test=20, sft=30, style="stepwise-real",
                              context=Context(quiet=True))
    passages, questions = real_docs.load(demo_world.REAL_MIX)
    real_train = [q for q in questions if q["split"] == "train"]
    real_test_ids = {q["id"] for q in questions if q["split"] == "test"}
    assert summary["real_passages"] == len(passages) and summary["real_train"] == len(real_train)
    corpus = [json.loads(x) for x in (out / "corpus.jsonl").read_text().splitlines()]
    assert len(corpus) == summary["articles"] + len(passages)
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [q["id"] for q in train[-len(real_train):]] == [q["id"] for q in real_train]
    test_ids = {json.loads(x)["id"] for x in (out / "test.jsonl").read_text().splitlines()}
    assert not test_ids & real_test_ids
    rows = pq.read_table(out / "sft.parquet").to_pylist()
    real_rows = [r for r in rows if r["data_source"].startswith(demo_world.REAL_MIX)]
    assert len(rows) == 30 + len(real_rows) and len(real_rows) == summary["sft_real"] > len(real_train) // 2
    assert {r["id"] for r in real_rows} <= {q["id"] for q in real_train}  # train split only
    first_real = next(i for i, r in enumerate(rows) if r in real_rows)
    assert first_real < len(rows) - len(real_rows)  # shuffled in, not appended
    assert schema.provenance(pq.read_table(out / "sft.parquet"))[-1]["config"]["real"] == demo_world.REAL_MIX
    # the demo rows observe each fact as the tool output's own sentence, as the real rows do: the quote is in the
    # observation just before that turn, and the last quote holds the answer; a REFLECTION right after each quote
    # restates the fact in the relation's words, and the last one names the answer
    demo_rows = [r for r in rows if r not in real_rows]
    quoted = 0
    for r in demo_rows:
        last = restated = None
        for before, turn in zip(r["messages"][1:], r["messages"][2:]):
            if turn["role"] != "assistant":
                continue
            thoughts = agent_format.atomic_thoughts(turn["content"])
            for (tag, x), after in zip(thoughts, thoughts[1:] + [(None, "")]):
                said = re.fullmatch(r'[^"]*"(?P<q>[^"]+)"\.', x) if tag == "OBSERVATION" else None
                if said:
                    assert before["role"] == "tool" and said["q"] in before["content"], (x, before["content"])
                    assert "states that" not in x
                    assert after[0] == "REFLECTION" and said["q"] not in after[1], (x, after)
                    # the hop's goal comes before the quote: it names the entity the restated fact is about
                    lead = x.split('"')[0]
                    assert any(w in after[1] for w in re.findall(r"\b[A-Z][a-z]{3,}\b", lead)), (x, after)
                    quoted, last, restated = quoted + 1, said["q"], after[1]
        assert last is not None and r["answer"] in last, r["messages"][-1]["content"]
        assert r["answer"] in restated, (restated, r["answer"])
    # every expert turn fits the learn preset's token budget for a turn: a longer one teaches the policy turns that
    # the rollout cuts short (when 1 demo turn in 10 overran 192 tokens, most demo test episodes had a format error)
    from transformers import AutoTokenizer

    from atomcli.stages import run_all
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    budget = run_all.LEARN["rollout"]["max_new_tokens"]
    longest = max(len(tok(m["content"])["input_ids"]) for r in rows for m in r["messages"] if m["role"] == "assistant")
    assert longest <= budget, (longest, budget)
    assert quoted >= sum(r["n_search"] for r in demo_rows) // 2
    # the real rows' observations come from this world's own index: their urls resolve in it
    from atomcli.env import search_local
    index = search_local.LocalIndex(str(out / "index.sqlite"))
    urls = {u for r in real_rows for m in r["messages"] for u in re.findall(r"local://doc/[\w%.-]+", m["content"])}
    assert urls and all(index.read_local(u) is not None for u in urls)
    index.close()


def test_stepwise_real_world_with_query_ordered_snippets(tmp_path):
    """`--snippets query`: the experts search the world's index with the snippet order a rollout gets from
    `--search-options snippets=query`, so every search response in the SFT set is that engine's output (and
    not the page-order one, for some); the order is in the SFT table's provenance; other styles refuse it."""
    from atomcli.env import search_local
    from atomcli.env.tools import format_search
    out = tmp_path / "q"
    demo_world.main(str(out), seed=0, articles=300, train=60, test=20, sft=30, style="stepwise-real",
                    snippets="query", context=Context(quiet=True))
    table = pq.read_table(out / "sft.parquet")
    assert schema.provenance(table)[-1]["config"]["snippets"] == "query"
    query_ix = search_local.LocalIndex(str(out / "index.sqlite"), snippets="query")
    text_ix = search_local.LocalIndex(str(out / "index.sqlite"))
    seen = reordered = 0
    for row in table.to_pylist():
        for m in row["messages"]:
            for q in re.findall(r'Results for "([^"]+)":', m["content"]) if m["role"] == "tool" else []:
                assert format_search(q, query_ix.search(q, demo_world.SFT_K)) in m["content"], q
                seen += 1
                reordered += format_search(q, text_ix.search(q, demo_world.SFT_K)) not in m["content"]
    assert seen > 100 and reordered > seen // 10, (seen, reordered)
    proc = atom("demo-world", "--style", "classic", "--snippets", "query", "--out", tmp_path / "c")
    assert proc.returncode == 2 and b"stepwise" in proc.stderr and not (tmp_path / "c").exists()
    proc = atom("demo-world", "--style", "stepwise-real", "--snippets", "bogus", "--out", tmp_path / "b")
    assert proc.returncode == 2 and b"valid: query, text" in proc.stderr and not (tmp_path / "b").exists()
