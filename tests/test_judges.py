"""Judges: the OpenAI-compatible client against a fake server, the hf judge, the heuristic."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fake_openai import FakeOpenAI

from atomcli import plugins
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.rewards.judges import (
    HFJudge,
    JudgeError,
    heuristic_scores,
    make_heuristic,
    make_hf,
    make_openai,
)
from atomcli.rewards.rrm_prompt import Step, render_prompt

FAST = {"backoff": 0.01, "timeout": 5.0}  # keep retry waits short in tests


def openai_judge(server, **options):
    return make_openai(f"{server.base_url}#judge-model", Context(quiet=True), **{**FAST, **options})


# --- openai ------------------------------------------------------------------------------------

def test_openai_sends_a_chat_completion_and_returns_the_reply(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
    with FakeOpenAI("[7, 3]") as server:
        judge = openai_judge(server)
        assert judge.complete(["score this"]) == ["[7, 3]"]
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.json["model"] == "judge-model"
    assert req.json["messages"] == [{"role": "user", "content": "score this"}]
    assert req.json["temperature"] == 0.0
    assert req.headers["Authorization"] == "Bearer sk-test-123"
    assert judge.name == f"openai:{server.base_url}#judge-model"


def test_openai_key_comes_from_the_named_variable_and_is_optional(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-other")
    with FakeOpenAI("ok") as server:
        openai_judge(server).complete(["a"])
        openai_judge(server, api_key_env="MY_JUDGE_KEY").complete(["b"])
    assert "Authorization" not in server.requests[0].headers
    assert server.requests[1].headers["Authorization"] == "Bearer sk-other"


def test_openai_keeps_prompt_order_under_concurrency():
    # Concurrency is counted at the server, not timed: a loaded CI machine stretches wall time,
    # not the number of requests in flight at once.
    lock, in_flight, most = threading.Lock(), [0], [0]
    all_in = threading.Event()

    def echo(body, path):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] == 8:
                all_in.set()
        all_in.wait(5.0)  # a sequential client never gets here with 8 in flight: it waits out the 5 s once
        with lock:
            in_flight[0] -= 1
        return "reply to " + body["messages"][0]["content"]

    prompts = [f"p{i}" for i in range(8)]
    with FakeOpenAI(echo) as server:
        out = openai_judge(server, concurrency=8, timeout=30.0).complete(prompts)
    assert out == [f"reply to p{i}" for i in range(8)]
    assert most[0] == 8, f"at most {most[0]} of 8 requests were in flight at once: not concurrent"


def test_openai_retries_server_errors_then_succeeds():
    with FakeOpenAI([500, 503, "[5]"]) as server:
        out = openai_judge(server, retries=3).complete(["x"])
    assert out == ["[5]"]
    assert len(server.requests) == 3


def test_openai_retries_429_and_gives_up_after_the_attempts():
    with FakeOpenAI(429) as server:
        (out,) = openai_judge(server, retries=2).complete(["x"])
    assert isinstance(out, JudgeError)
    assert "429" in str(out) and "2 attempts" in str(out)
    assert len(server.requests) == 2


def test_openai_does_not_retry_client_errors():
    with FakeOpenAI(404) as server:
        (out,) = openai_judge(server, retries=3).complete(["x"])
    assert isinstance(out, JudgeError) and "404" in str(out)
    assert len(server.requests) == 1


def test_openai_timeout_is_retried_then_recorded():
    with FakeOpenAI([("sleep", 1.0, "late"), "[1]"]) as server:
        assert openai_judge(server, timeout=0.2).complete(["x"]) == ["[1]"]
    with FakeOpenAI(("sleep", 1.0, "late")) as server:
        (out,) = openai_judge(server, timeout=0.2, retries=2).complete(["x"])
    assert isinstance(out, JudgeError) and "timed out" in str(out)
    assert len(server.requests) == 2


def test_openai_malformed_response_is_an_error_not_a_reply():
    with FakeOpenAI({"choices": []}) as server:
        (out,) = openai_judge(server).complete(["x"])
    assert isinstance(out, JudgeError) and "not a chat completion" in str(out)


def test_openai_unreachable_server_is_an_error():
    with FakeOpenAI("x") as server:
        url = server.base_url
    judge = make_openai(f"{url}#m", Context(quiet=True), retries=2, backoff=0.01, timeout=2.0)
    (out,) = judge.complete(["x"])
    assert isinstance(out, JudgeError) and "cannot reach" in str(out)


def test_openai_never_echoes_the_key_in_errors(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-leaky-999")

    def echo_key(body, path):  # a server that quotes the credentials back in its error
        return {"error": {"message": "bad key sk-leaky-999"}}

    with FakeOpenAI(echo_key) as server:
        (out,) = openai_judge(server).complete(["x"])
    assert isinstance(out, JudgeError)
    assert "sk-leaky-999" not in str(out)


def test_openai_rate_limit_spaces_the_calls():
    with FakeOpenAI("ok") as server:
        t0 = time.monotonic()
        openai_judge(server, rate=10.0, concurrency=4).complete(["x"] * 6)
        elapsed = time.monotonic() - t0
    assert elapsed >= 0.4, f"6 calls at 10/s took {elapsed:.2f} s"


@pytest.mark.parametrize("arg", ["http://localhost:8000/v1", "http://localhost:8000/v1#", "ftp://host/v1#m",
                                 "#model"])
def test_openai_bad_specs_fail_before_any_call(arg):
    with pytest.raises(InputError):
        make_openai(arg, Context(quiet=True))


# --- registry ------------------------------------------------------------------------------------

def test_unknown_judge_lists_the_valid_ones():
    with pytest.raises(InputError) as e:
        plugins.make_judge("gpt5", Context(quiet=True))
    for name in ("heuristic", "hf", "openai"):
        assert name in str(e.value)


def test_context_builds_judges_from_specs():
    judge = Context(quiet=True).judge("heuristic", concurrency=2, batch_size=4)  # unused options ignored
    assert judge.name == "heuristic"


# --- heuristic -----------------------------------------------------------------------------------

def test_heuristic_scores_follow_the_documented_formula():
    question = "Who founded Zorbia?"  # content words: founded, zorbia
    turns = [
        ([("PLAN", "Search Zorbia founded date"),          # W=4 (search, zorbia, founded, date), g=2/4
          ("OBSERVATION", "Anna Kell founded Zorbia"),     # W=4, g=2/4 (anna, kell not yet seen)
          ("THINK", "   ")],                               # empty -> 0
         "Zorbia was founded by Anna Kell in 1802."),
        ([("OBSERVATION", "Anna Kell founded Zorbia"),     # repeat -> capped at 1
          ("REFLECTION", "Kell founded Zorbia 1802"),      # W=4, all grounded now: 1 + 7 + 1
          ("HYPOTHESIS_TESTING", "maybe")],                # W=1, g=0: 1 + 0 + 1 - 2 = 0
         None),
    ]
    # PLAN: 1 + 7*0.5 + 1 = 5.5 -> 6 ; OBSERVATION: 1 + 3.5 = 4.5 -> 5 (half up)
    assert heuristic_scores(question, turns) == [6, 5, 0, 1, 9, 0]


def test_heuristic_judge_reads_score_rrm_prompts_and_refuses_others():
    steps = [Step([("PLAN", "Search Zorbia founded date")], '{"name": "web_search"}', "Zorbia was founded.")]
    judge = make_heuristic("", Context(quiet=True))
    reply, other = judge.complete([render_prompt("Who founded Zorbia?", steps), "Is Paris correct?"])
    assert json.loads(reply) == heuristic_scores("Who founded Zorbia?", [(steps[0].thoughts, steps[0].observation)])
    assert isinstance(other, JudgeError)


def test_heuristic_takes_no_argument():
    with pytest.raises(InputError):
        make_heuristic("x", Context(quiet=True))


# --- hf --------------------------------------------------------------------------------------------

def test_hf_judge_generates_one_reply_per_prompt(tiny_model):
    judge = make_hf(str(tiny_model), Context(quiet=True), batch_size=2, max_new_tokens=4)
    assert judge.name == f"hf:{tiny_model}"
    out = judge.complete(["short", "a somewhat longer prompt than that", "third"])
    assert len(out) == 3 and all(isinstance(r, str) for r in out)
    # greedy: the same prompt gives the same reply, whatever batch it lands in
    assert judge.complete(["third"]) == [out[2]]


def test_hf_judge_refuses_prompts_past_its_context(tiny_model):
    model_judge = make_hf(str(tiny_model), Context(quiet=True), max_new_tokens=4)
    small = HFJudge("hf:small", model_judge.model, model_judge.tok, max_new_tokens=4)
    small.max_len = 64
    ok, too_long = small.complete(["hi", "word " * 200])
    assert isinstance(ok, str)
    assert isinstance(too_long, JudgeError) and "exceeds" in str(too_long)


def test_hf_judge_needs_a_model():
    with pytest.raises(InputError):
        make_hf("", Context(quiet=True))
