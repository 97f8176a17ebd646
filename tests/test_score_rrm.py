"""score-rrm: thought extraction, the judge prompt, reply parsing, failures, the CLI end to end."""

from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import atom
from fake_openai import FakeOpenAI
from hypothesis import given, settings
from hypothesis import strategies as st

from atomcli import plugins, schema
from atomcli.agent import format as agent_format
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.rewards.judges import JudgeError
from atomcli.rewards.rrm_prompt import (
    Step,
    parse_prompt,
    parse_scores,
    render_prompt,
    trajectory_steps,
)
from atomcli.stages.score_rrm import ScoreConfig, run, score

QUESTION = "Who founded Zorbia?"


def call(query):
    return '<tool_call>{"name": "web_search", "arguments": {"query": ["%s"]}}</tool_call>' % query


def traj_two_turns():
    return [
        {"role": "system", "content": agent_format.system_prompt(date="2025-01-01")},
        {"role": "user", "content": agent_format.user_message(QUESTION)},
        {"role": "assistant", "content": "<think> <PLAN>Search for the founder of Zorbia.</PLAN> "
                                         "<RISK_ANALYSIS>There may be two places named Zorbia.</RISK_ANALYSIS> "
                                         "</think>" + call("Zorbia founder")},
        {"role": "tool", "content": agent_format.tool_message("1. Zorbia\n   Zorbia was founded by Anna Kell.")},
        {"role": "assistant", "content": "<think><OBSERVATION>Anna Kell founded Zorbia.</OBSERVATION></think>"
                                         "<answer>Anna Kell</answer>"},
    ]


def traj_bare_think():
    return [
        {"role": "user", "content": agent_format.user_message(QUESTION)},
        {"role": "assistant", "content": "<think>I will just guess.</think><answer>Bob</answer>"},
    ]


def traj_no_thoughts():
    return [
        {"role": "user", "content": agent_format.user_message(QUESTION)},
        {"role": "assistant", "content": "<answer>Bob</answer>"},
    ]


def rollout_table(trajs=None) -> pa.Table:
    trajs = trajs or [traj_two_turns(), traj_bare_think(), traj_no_thoughts()]
    n = len(trajs)
    answers = [agent_format.extract_answer(t[-1]["content"]) for t in trajs]
    return pa.table({
        "id": schema.array("id", ["q1"] * n),
        "question": schema.array("question", [QUESTION] * n),
        "golden_answers": schema.array("golden_answers", [["Anna Kell", "Kell, Anna"]] * n),
        "traj_id": schema.array("traj_id", [f"q1/{i}" for i in range(n)]),
        "group_id": schema.array("group_id", ["q1"] * n),
        "messages": schema.array("messages", trajs),
        "answer": schema.array("answer", answers),
        "format_ok": schema.array("format_ok", [agent_format.trajectory_format_ok(t) for t in trajs]),
        "note": pa.array([f"keep {i}" for i in range(n)]),
    })


class Scripted:
    """A judge that answers from a function of (prompt, attempt), recording what it was asked."""
    name = "scripted"

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def complete(self, prompts):
        self.calls.append(list(prompts))
        return [self.answer(p, len(self.calls)) for p in prompts]


def n_thoughts(prompt: str) -> int:
    return int(re.search(r"There are (\d+) thoughts", prompt).group(1))


# --- extraction and the prompt -------------------------------------------------------------------

def test_steps_pair_thoughts_with_actions_and_observations():
    steps = trajectory_steps(traj_two_turns())
    assert [s.thoughts for s in steps] == [
        [("PLAN", "Search for the founder of Zorbia."), ("RISK_ANALYSIS", "There may be two places named Zorbia.")],
        [("OBSERVATION", "Anna Kell founded Zorbia.")]]
    assert json.loads(steps[0].action)["name"] == "web_search"
    assert steps[0].observation == "1. Zorbia\n   Zorbia was founded by Anna Kell."
    assert steps[1].action == "answer: Anna Kell" and steps[1].observation is None
    assert trajectory_steps(traj_bare_think())[0].thoughts == [("THINK", "I will just guess.")]


def test_prompt_numbers_thoughts_and_never_shows_the_golden_answer():
    steps = trajectory_steps(traj_two_turns())
    prompt = render_prompt(QUESTION, steps)
    assert "THOUGHT 1 (PLAN)" in prompt and "THOUGHT 2 (RISK_ANALYSIS)" in prompt
    assert "THOUGHT 3 (OBSERVATION)" in prompt
    assert "There are 3 thoughts" in prompt and "JSON list" in prompt
    assert "golden" not in prompt.lower()
    assert prompt.index("Zorbia was founded by Anna Kell") > prompt.index("THOUGHT 2 (RISK_ANALYSIS)")
    assert parse_scores(prompt, 3) is None  # nothing in the prompt itself reads as an answer
    assert parse_prompt(prompt) == (QUESTION, steps)


def test_long_observations_are_cut():
    steps = [Step([("PLAN", "p")], "(none)", "x" * 5000)]
    prompt = render_prompt(QUESTION, steps, obs_chars=100)
    assert "x" * 100 in prompt and "x" * 101 not in prompt and "[cut]" in prompt


texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40) | st.lists(
    st.sampled_from(["### TASK", "### TURN 3", "THOUGHT 9 (X)", "ACTION", "RESULT", "", "    ", "x", "\r"]),
    max_size=6).map("\n".join)


@settings(max_examples=150, deadline=None)
@given(question=texts, steps=st.lists(st.builds(
    Step, st.lists(st.tuples(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), texts), max_size=4),
    texts, st.none() | texts), max_size=4))
def test_prompt_round_trips_whatever_the_text(question, steps):
    # thought text full of "### TASK", "THOUGHT 9 (X)" or blank lines must not confuse the reader
    assert parse_prompt(render_prompt(question, steps, obs_chars=0)) == (question, steps)


# --- reading replies -----------------------------------------------------------------------------

@pytest.mark.parametrize("reply, n, want", [
    ("[7, 3, 10]", 3, [7.0, 3.0, 10.0]),
    ("Here are my scores:\n```json\n[0, 5]\n```\nDone.", 2, [0.0, 5.0]),
    ('{"scores": [4, 6]}', 2, [4.0, 6.0]),
    ("Thoughts [1] and [2]: [8, 9]", 2, [8.0, 9.0]),       # only a list of the right length counts
    ("[7.5, 2.0]", 2, [7.5, 2.0]),
    ("[7, 3]", 3, None),                                    # wrong length
    ("[7, 11]", 2, None),                                   # out of range
    ("[-1, 3]", 2, None),
    ('["7", "3"]', 2, None),
    ("[true, false]", 2, None),
    ("[NaN, 3]", 2, None),
    ("7, 3", 2, None),
    ("", 1, None),
    ("[[7, 3]", 2, [7.0, 3.0]),
])
def test_parse_scores(reply, n, want):
    assert parse_scores(reply, n) == want


@settings(max_examples=300, deadline=None)
@given(reply=st.text(alphabet=st.sampled_from(list("[]{},.0123456789 -e\"abc\n`")) | st.characters(),
                     max_size=60), n=st.integers(0, 5))
def test_parse_scores_never_raises(reply, n):
    out = parse_scores(reply, n)
    assert out is None or (len(out) == n and all(0 <= x <= 10 for x in out))


# --- the retry loop ------------------------------------------------------------------------------

def test_unparseable_reply_is_retried_with_a_reminder():
    judge = Scripted(lambda p, attempt: "I think they are fine." if attempt == 1 else "[6]")
    scores, errors = score(judge, {0: "PROMPT"}, {0: 1}, retries=3)
    assert scores == {0: [6.0]} and errors == {}
    assert judge.calls[0] == ["PROMPT"]
    assert judge.calls[1][0].startswith("PROMPT") and "could not be read" in judge.calls[1][0]


def test_judge_errors_are_recorded_not_retried_and_never_zero():
    judge = Scripted(lambda p, attempt: JudgeError("HTTP 500") if p == "A" else "garbage")
    scores, errors = score(judge, {0: "A", 1: "B"}, {0: 2, 1: 2}, retries=3)
    assert scores == {}
    assert "HTTP 500" in errors[0]
    assert "unparseable" in errors[1] and "3 attempt" in errors[1]
    assert [len(c) for c in judge.calls] == [2, 1, 1]  # only the unparseable row is asked again


def test_a_judge_that_breaks_its_contract_loses_rows_not_the_run():
    class Raises:
        name = "broken"

        def complete(self, prompts):
            raise RuntimeError("boom")

    class Short:
        name = "short"

        def complete(self, prompts):
            return ["[1]"]

    _, errors = score(Raises(), {0: "a", 1: "b"}, {0: 1, 1: 1}, retries=2)
    assert set(errors) == {0, 1} and "boom" in errors[0]
    _, errors = score(Short(), {0: "a", 1: "b"}, {0: 1, 1: 1}, retries=1)
    assert set(errors) == {0, 1} and "1 replies for 2 prompts" in errors[0]


# --- the stage -----------------------------------------------------------------------------------

def test_run_with_the_heuristic_judge():
    table = rollout_table()
    out = run(table, ScoreConfig(judge="heuristic"), Context(quiet=True))
    # other columns pass through untouched, in place
    assert out.column_names[:table.num_columns] == table.column_names
    for name in table.column_names:
        assert out.column(name).equals(table.column(name))
    rows = out.to_pylist()
    first = rows[0]["atomic_thoughts"]
    assert [(t["turn"], t["tag"]) for t in first] == [(0, "PLAN"), (0, "RISK_ANALYSIS"), (1, "OBSERVATION")]
    assert all(isinstance(t["score"], float) and 0 <= t["score"] <= 10 for t in first)
    assert rows[0]["atr"] == pytest.approx(sum(t["score"] for t in first) / len(first) / 10)
    assert rows[1]["atomic_thoughts"][0]["tag"] == "THINK"
    # no thoughts at all: a legitimate 0, not a judge failure
    assert rows[2]["atomic_thoughts"] == [] and rows[2]["atr"] == 0.0 and rows[2]["rrm_error"] is None
    assert {r["rrm_judge"] for r in rows} == {"heuristic"} and all(r["rrm_error"] is None for r in rows)
    assert out.schema.field("atomic_thoughts").type == schema.COLUMNS["atomic_thoughts"].type


def test_chunked_scoring_equals_one_pass(monkeypatch):
    """Rows are scored CHUNK at a time (memory); chunk borders change nothing, failures included."""
    import pyarrow as pa
    table = pa.concat_tables([rollout_table()] * 3)  # 9 rows: thoughts, thoughts, none, ...
    judge = Scripted(lambda p, a: "[7, 3, 5]" if n_thoughts(p) == 3 else "no idea")  # one row kind fails
    monkeypatch.setitem(plugins.JUDGES, "scripted", lambda arg, context, **options: judge)
    whole = run(table, ScoreConfig(judge="scripted", retries=1), Context(quiet=True))
    monkeypatch.setattr("atomcli.stages.score_rrm.CHUNK", 2)
    chunked = run(table, ScoreConfig(judge="scripted", retries=1), Context(quiet=True))
    assert chunked.equals(whole)
    assert whole.column("atr").null_count > 0 and whole.column("atr").drop_null().to_pylist()  # both kinds present


def test_run_records_failures_with_null_atr_and_null_scores(monkeypatch):
    judge = Scripted(lambda p, a: "no idea")
    monkeypatch.setitem(plugins.JUDGES, "scripted", lambda arg, context, **options: judge)
    out = run(rollout_table(), ScoreConfig(judge="scripted", retries=2), Context(quiet=True)).to_pylist()
    for row in out[:2]:
        assert row["atr"] is None
        assert "unparseable" in row["rrm_error"]
        assert row["atomic_thoughts"] and all(t["score"] is None for t in row["atomic_thoughts"])
    assert out[2]["atr"] == 0.0 and out[2]["rrm_error"] is None  # never asked


@pytest.mark.parametrize("field, value", [("retries", 0), ("concurrency", 0), ("timeout", 0.0), ("rate", -1.0)])
def test_bad_options_are_input_errors(field, value):
    with pytest.raises(InputError):
        run(rollout_table(), ScoreConfig(**{field: value}), Context(quiet=True))


def test_run_against_an_openai_compatible_judge():
    def responder(body, path):
        prompt = body["messages"][0]["content"]
        n = n_thoughts(prompt)
        if "could not be read" not in prompt and n == 3:
            return "Sure! Here you go: [8, 8"  # cut short: the first answer for the long trajectory
        return "```json\n" + json.dumps([6] * n) + "\n```"

    with FakeOpenAI(responder) as server:
        cfg = ScoreConfig(judge=f"openai:{server.base_url}#rrm", backoff=0.01)
        out = run(rollout_table(), cfg, Context(quiet=True)).to_pylist()
    assert [r["atr"] for r in out] == [0.6, 0.6, 0.0]
    assert all(r["rrm_error"] is None for r in out)
    assert len(server.requests) == 3  # two trajectories with thoughts, one asked twice
    assert all("Kell, Anna" not in r.json["messages"][0]["content"] for r in server.requests)  # no golden


# --- the command line ------------------------------------------------------------------------------

def _write(table: pa.Table, path) -> None:
    pq.write_table(table, path)


def test_cli_openai_judge_key_never_reaches_the_table(tmp_path):
    src, dst = tmp_path / "rollouts.parquet", tmp_path / "scored.parquet"
    _write(rollout_table(), src)
    secret = "sk-very-secret-4242"
    with FakeOpenAI(lambda body, path: json.dumps([5] * n_thoughts(body["messages"][0]["content"]))) as server:
        proc = atom("score-rrm", src, "--out", dst, "--judge", f"openai:{server.base_url}#rrm",
                    "--api-key-env", "RRM_KEY", env={"RRM_KEY": secret}, check=True)
    assert {r.headers.get("Authorization") for r in server.requests} == {f"Bearer {secret}"}
    assert proc.stdout == b""
    raw = dst.read_bytes()
    assert secret.encode() not in raw and secret.encode() not in proc.stderr
    table = pq.read_table(dst)
    assert table.column("atr").to_pylist() == [0.5, 0.5, 0.0]
    prov = schema.provenance(table)[-1]
    assert prov["stage"] == "score-rrm" and prov["config"]["judge"] == f"openai:{server.base_url}#rrm"


def test_cli_with_the_tiny_model_records_judge_errors(tmp_path, tiny_model):
    # a random-init model writes garbage: every judged row must say so, none may get a score
    src = tmp_path / "rollouts.jsonl"
    src.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rollout_table().to_pylist()))
    proc = atom("score-rrm", src, "--out", "-", "--format", "jsonl", "--judge", f"hf:{tiny_model}",
                "--max-new-tokens", "6", "--retries", "2", check=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 3
    for row in rows[:2]:
        assert row["atr"] is None and "unparseable" in row["rrm_error"]
        assert all(t["score"] is None for t in row["atomic_thoughts"])
    assert rows[2]["atr"] == 0.0 and rows[2]["rrm_error"] is None
    assert b"judge errors 2" in proc.stderr


@pytest.mark.slow  # ~10 s on an idle 2-core machine, over 2 minutes on a busy one
def test_cli_with_smollm2_runs_offline(tmp_path):
    src = tmp_path / "rollouts.parquet"
    _write(rollout_table([traj_two_turns(), traj_bare_think()]), src)
    proc = atom("score-rrm", src, "--out", "-", "--format", "jsonl", "--judge", "hf:smollm2",
                "--max-new-tokens", "24", "--retries", "1", check=True)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["rrm_judge"] for r in rows] == ["hf:smollm2"] * 2
    for row in rows:  # a small model may or may not produce a valid list; either way it is consistent
        scores = [t["score"] for t in row["atomic_thoughts"]]
        if row["rrm_error"] is None:
            assert 0 <= row["atr"] <= 1 and all(s is not None for s in scores)
            assert row["atr"] == pytest.approx(sum(scores) / len(scores) / 10)
        else:
            assert row["atr"] is None and all(s is None for s in scores)


def test_cli_missing_column_names_the_stage():
    proc = atom("score-rrm", "-", "--out", "-", input='{"id": "q1", "question": "x", "golden_answers": ["y"]}\n')
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"`messages`" in proc.stderr and b"atom rollout" in proc.stderr


def test_cli_unknown_judge_fails_before_work():
    row = {"question": "x", "traj_id": "a/0", "messages": [{"role": "user", "content": "x"}]}
    proc = atom("score-rrm", "-", "--out", "-", "--judge", "gpt9", input=json.dumps(row) + "\n")
    assert proc.returncode == 2 and proc.stdout == b""
    assert b"heuristic" in proc.stderr and b"openai" in proc.stderr


# --- parsers score-rrm relies on never raise (agent_format) -----------------------------------------

FRAGMENTS = ["<think>", "</think>", "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<PLAN>", "</PLAN>",
             "<A_1>", "</A_1>", '{"name": "web_search", "arguments": {"query": ["q"]}}', '{"name": ',
             '"browse_webpage"', '"arguments": {"url_list": "u", "query": 3}}', "[", "]", "{", "}", "\n", " ", "x"]
model_text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=25).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=model_text)
def test_agent_format_parsers_are_total(text):
    units = agent_format.atomic_thoughts(text)
    assert all(isinstance(tag, str) and tag and isinstance(body, str) for tag, body in units)
    turn = agent_format.parse_turn(text)
    assert turn.well_formed == (not turn.problems)
    answer = agent_format.extract_answer(text)
    assert answer is None or isinstance(answer, str)
    call_ = agent_format.parse_tool_call(text)
    assert call_.error is not None or call_.name in agent_format.TOOL_NAMES
    if call_.error is None:
        assert call_.arguments  # a valid call always carries its arguments
    assert isinstance(agent_format.trajectory_format_ok([{"role": "assistant", "content": text}]), bool)
    steps = trajectory_steps([{"role": "assistant", "content": text}, {"role": "tool", "content": text}])
    assert sum(len(s.thoughts) for s in steps) == len(units)


@given(value=st.none() | st.integers() | st.lists(st.integers()))
def test_agent_format_parsers_accept_non_strings(value):
    assert agent_format.atomic_thoughts(value) == []
    assert agent_format.extract_answer(value) is None
    assert agent_format.parse_turn(value).well_formed is False
