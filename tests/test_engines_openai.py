"""The OpenAI-compatible rollout engine against a programmable server on 127.0.0.1.

`vllm_like` answers `/v1/completions` the way vLLM does with `return_tokens_as_token_ids`:
it continues the token-id prompt with the next scripted turn and returns the ids it
"sampled" (`token_id:N`) and their log-probs. Tool calls run for real (a fake search
backend), so masks and glue are exercised across HTTP as in the in-process engine.
"""

from __future__ import annotations

import math

import pytest
from fake_openai import FakeOpenAI
from test_rollout import questions, runs

from atomcli import plugins, schema
from atomcli.context import Context
from atomcli.engines.base import GenRequest
from atomcli.engines.openai import EngineError, OpenAIEngine, parse_spec
from atomcli.errors import InputError
from atomcli.stages import rollout

TURNS = [
    '<think><PLAN>look</PLAN></think>\n<tool_call>{"name": "web_search", '
    '"arguments": {"query": ["Alice"]}}</tool_call>',
    '<think>bad</think><tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    '<think>idle</think>',  # ends with the end-of-sequence token
    '<think><OBSERVATION>seen</OBSERVATION></think>\n<answer>Paris</answer>',
]
LOGPROB = -0.25


@plugins.register_search("fakeweb")
def _fake(arg, context, **_):
    class Backend:
        name = "fakeweb"
        traits = plugins.SearchTraits("fakeweb")

        def read_local(self, url):
            return None

        def search(self, query, k):
            return [{"title": f"{query} page", "url": "https://example.org/a", "snippet": "born in Paris"}]
    return Backend()


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model))


def count(seq: list[int], sub: list[int]) -> int:
    return sum(1 for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub)


def vllm_like(tok, turns=TURNS, *, token_ids=True, logprobs=True, strip_stop=False):
    opening = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]

    def respond(body, path):
        assert path.endswith("/completions")
        prompt = body["prompt"] if isinstance(body["prompt"], list) else \
            tok(body["prompt"], add_special_tokens=False)["input_ids"]
        text = turns[min(count(prompt, opening), len(turns)) - 1]
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if not any(s in text for s in body.get("stop", [])):
            ids.append(tok.eos_token_id)
        finish = "stop" if len(ids) <= body["max_tokens"] else "length"
        ids = ids[:body["max_tokens"]]
        out = tok.decode(ids, skip_special_tokens=True)
        choice = {"index": 0, "text": out, "finish_reason": finish, "logprobs": None}
        if strip_stop:
            for s in body["stop"]:
                if out.endswith(s):
                    choice.update(text=out[:-len(s)], stop_reason=s)
        if logprobs:
            choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids] if token_ids else
                                  [tok.decode([i]) for i in ids], "token_logprobs": [LOGPROB] * len(ids)}
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": [choice]}
    return respond


def cfg(server, tiny_model, **kw):
    base = dict(model=f"openai:{server.base_url}#served", tokenizer=str(tiny_model), search="fakeweb",
                group_size=2, max_turns=6, max_new_tokens=64, k=1, date="2026-01-01", concurrency=4, seed=5)
    return rollout.RolloutConfig(**{**base, **kw})


def check_contract(row, tok):
    p, c, m, lp = row["prompt_ids"], row["completion_ids"], row["loss_mask"], row["old_logprobs"]
    assert len(c) == len(m) == len(lp)
    assert tok.decode(p + c, skip_special_tokens=False) == tok.apply_chat_template(row["messages"], tokenize=False)
    assistants = [x["content"] for x in row["messages"] if x["role"] == "assistant"]
    sampled = [(s, e) for v, s, e in runs(m) if v == 1]
    assert len(sampled) == len(assistants)
    for (s, e), content in zip(sampled, assistants):
        assert tok.decode(c[s:e], skip_special_tokens=True) == content
    assert all(v == 0.0 for v, k in zip(lp, m) if k == 0)


def test_exact_ids_and_logprobs_from_a_vllm_like_server(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok)) as server:
        out = rollout.run(questions(2), cfg(server, tiny_model), ctx)
        prov = rollout.provenance_fields(cfg(server, tiny_model), ctx)
    rows = out.to_pylist()
    assert len(rows) == 4
    for row in rows:
        check_contract(row, tok)
        assert (row["finish_reason"], row["answer"], row["n_turns"]) == ("answer", "Paris", 4)
        assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == TURNS
        assert [(c["name"], c["ok"]) for c in row["tool_calls"]] == [("web_search", True), ("nope", False), ("", False)]
        assert "unknown tool" in row["tool_calls"][1]["error"]
        assert all(v == LOGPROB for v, k in zip(row["old_logprobs"], row["loss_mask"]) if k == 1)
    # every request continued exactly the recorded tokens: the prompt of turn t is the row's
    # ids up to the start of turn t's sampled run
    by_prompt = {tuple(r.json["prompt"]) for r in server.requests}
    for row in rows:
        ids = row["prompt_ids"] + row["completion_ids"]
        for s, e in [(s, e) for v, s, e in runs(row["loss_mask"]) if v == 1]:
            assert tuple(ids[:len(row["prompt_ids"]) + s]) in by_prompt
    body = server.requests[0].json
    assert body["model"] == "served" and body["stop"] == ["</tool_call>", "</answer>"]
    assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["max_tokens"] == 64 and isinstance(body["seed"], int)
    assert len(server.requests) == 16
    assert prov["extra"]["tokens"] == "exact" and prov["extra"]["engine"] == "openai"


def test_text_only_server_is_retokenized_and_says_so(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok, logprobs=False)) as server:
        c = cfg(server, tiny_model, group_size=1)
        out = rollout.run(questions(1), c, ctx)
        assert rollout.provenance_fields(c, ctx)["extra"]["tokens"] == "retokenized"
    row = out.to_pylist()[0]
    check_contract(row, tok)
    assert row["finish_reason"] == "answer"
    sampled = [v for v, k in zip(row["old_logprobs"], row["loss_mask"]) if k == 1]
    assert sampled and all(math.isnan(v) for v in sampled)  # unknown, and loudly so


def test_stop_string_cut_from_the_text_by_the_server(tiny_model, tok):
    # vLLM without include_stop_str_in_output: the text loses the stop string, the ids keep it
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok, strip_stop=True)) as server:
        c = cfg(server, tiny_model, group_size=1)
        row = rollout.run(questions(1), c, ctx).to_pylist()[0]
        assert rollout.provenance_fields(c, ctx)["extra"]["tokens"] == "exact"
    check_contract(row, tok)
    assert row["answer"] == "Paris" and row["messages"][2]["content"] == TURNS[0]
    # a text-only server that cuts it: its tokens are added back (re-tokenized, log-prob unknown)
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok, strip_stop=True, logprobs=False)) as server:
        row = rollout.run(questions(1), cfg(server, tiny_model, group_size=1), ctx).to_pylist()[0]
    check_contract(row, tok)
    assert row["answer"] == "Paris" and row["messages"][2]["content"] == TURNS[0]


def test_transient_errors_are_retried(tiny_model, tok):
    ok = vllm_like(tok)
    replies = iter([503, 429])
    with FakeOpenAI(lambda body, path: next(replies, None) or ok(body, path)) as server:
        engine = OpenAIEngine("openai:x", server.base_url + "/completions", "served", tok, retries=3, backoff=0.01)
        ids = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        res = engine.generate([GenRequest(ids, 64, stops=("</tool_call>",))])[0]
    assert len(server.requests) == 3
    assert res.stop == "stop" and tok.decode(res.ids) == TURNS[0] and res.logprobs == [LOGPROB] * len(res.ids)


def test_server_down_stops_the_run(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(500) as server:
        with pytest.raises(EngineError, match="after 2 attempts"):
            rollout.run(questions(1), cfg(server, tiny_model, retries=2), ctx)
    with FakeOpenAI(("sleep", 1.0)) as server:
        with pytest.raises(EngineError, match="timed out"):
            rollout.run(questions(1), cfg(server, tiny_model, retries=1, timeout=0.2), ctx)


def test_a_rejected_request_ends_only_its_trajectory(tiny_model, tok):
    ctx = Context(quiet=True)
    ok = vllm_like(tok)

    def respond(body, path):  # the server refuses one question's prompt
        if "person 1" in tok.decode(body["prompt"]):
            return 400
        return ok(body, path)
    with FakeOpenAI(respond) as server:
        out = rollout.run(questions(2), cfg(server, tiny_model, group_size=1), ctx)
    a, b = out.to_pylist()
    assert a["finish_reason"] == "answer"
    assert b["finish_reason"] == "error" and b["completion_ids"] == [] and b["n_turns"] == 0
    check_contract(a, tok)


def test_prompt_as_text(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok)) as server:
        out = rollout.run(questions(1), cfg(server, tiny_model, group_size=1, prompt_ids=False), ctx)
        assert isinstance(server.requests[0].json["prompt"], str)
        assert server.requests[0].json["prompt"].endswith("<|im_start|>assistant\n")
    check_contract(out.to_pylist()[0], tok)


def test_bad_specs_are_usage_errors():
    assert parse_spec("openai:http://127.0.0.1:8000/v1#org/model") == ("http://127.0.0.1:8000/v1/completions",
                                                                        "org/model")
    for bad in ("openai:http://127.0.0.1:8000/v1", "openai:ftp://x/v1#m", "openai:#m"):
        with pytest.raises(InputError):
            parse_spec(bad)


def test_provenance_is_recorded_in_the_written_table(tiny_model, tok, tmp_path):
    from atomcli import models, tableio
    from atomcli.stages import rollout_io
    ctx = Context(quiet=True)
    with FakeOpenAI(vllm_like(tok)) as server:
        c = cfg(server, tiny_model, group_size=1)
        rollout_io.run_to_file(rollout, questions(1), c, ctx, out=str(tmp_path / "r.parquet"), fmt=None, resume=False)
    table = tableio.read_table(str(tmp_path / "r.parquet"))
    assert table.column("finish_reason").to_pylist() == ["answer"]
    rec = schema.token_source(table)
    assert rec["stage"] == "rollout" and rec["model"] == c.model and rec["tokens"] == "exact"
    assert rec["tokenizer"] == models.tokenizer_id(tok) and rec["prompt"] == "ids"


def test_both_engines_have_every_member_of_the_engine_protocol(tiny_model, tok):
    """The rollout uses exactly what `engines.base.Engine` declares, with no probing: both engines must have it."""
    from atomcli import models
    from atomcli.engines.base import Engine
    from atomcli.engines.hf import HFEngine
    members = [m for m in vars(Engine) if not m.startswith("_")] + list(Engine.__annotations__)
    assert {"generate", "release", "complete", "provenance", "tokenizer", "max_positions", "kind"} <= set(members)
    model, mtok = models.load(str(tiny_model))
    hf = HFEngine("tiny", model, mtok)
    http = OpenAIEngine("openai:x", "http://127.0.0.1:9/completions", "served", tok)
    for engine in (hf, http):
        missing = [m for m in members if not hasattr(engine, m)]
        assert not missing, f"{type(engine).__name__} lacks {missing}"
    assert hf.max_positions == model.config.max_position_embeddings and http.max_positions is None


# --- servers that refuse what they do not know (transformers serve's answers, replayed) ---------------

def transformers_like(tok, turns=TURNS, *, past_stop: str = ""):
    """Answers as `transformers serve` 5.x does: HTTP 422 naming any field it does not take, 400 for a
    token-id prompt, and text only (no ids, no log-probs); `past_stop`: text it runs on with after a stop
    string (its continuous batching ignores `stop`)."""
    text_only = vllm_like(tok, turns, logprobs=False)
    accepted = {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "n", "stream", "logprobs", "stop",
                "generation_config"}

    def respond(body, path):
        extra = set(body) - accepted
        if extra:
            return ("status", 422, {"detail": f"Unexpected fields in the request: {extra}"})
        if not isinstance(body["prompt"], str):
            return ("status", 400, {"detail": "prompt must be a string."})
        reply = text_only(body, path)
        if past_stop and any(reply["choices"][0]["text"].endswith(s) for s in body.get("stop", [])):
            reply["choices"][0]["text"] += past_stop
        return reply
    return respond


def test_a_transformers_serve_like_server_is_learned_once_and_sampled_for_real(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(transformers_like(tok)) as server:
        c = cfg(server, tiny_model, group_size=1, concurrency=1, temperature=1.0)
        out = rollout.run(questions(2), c, ctx)
        prov = rollout.provenance_fields(c, ctx)
    rows = out.to_pylist()
    for row in rows:
        check_contract(row, tok)
        assert row["finish_reason"] == "answer" and row["answer"] == "Paris"
    # one 422 (the vLLM fields), one 400 (the id prompt), then everything answered on the first try
    codes = [set(r.json) & set(["return_tokens_as_token_ids"]) for r in server.requests]
    assert codes[0] and not any(codes[1:])
    assert isinstance(server.requests[1].json["prompt"], list)
    answered = server.requests[2:]
    assert len(answered) == 8 and all(isinstance(r.json["prompt"], str) for r in answered)
    # its sampling starts from the model's generation config: the engine asks for real sampling
    assert {r.json["generation_config"] for r in answered} == {'{"do_sample": true, "top_k": 0}'}
    assert (prov["extra"]["tokens"], prov["extra"]["prompt"], prov["extra"]["server_kind"]) == \
        ("retokenized", "text", "transformers")


def test_text_past_a_stop_string_is_cut_at_the_stop(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(transformers_like(tok, past_stop="\n<think>more</think>")) as server:
        row = rollout.run(questions(1), cfg(server, tiny_model, group_size=1), ctx).to_pylist()[0]
    check_contract(row, tok)
    assert row["finish_reason"] == "answer" and row["answer"] == "Paris"
    assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == TURNS


def test_a_server_that_refuses_every_request_stops_the_run(tiny_model, tok):
    ctx = Context(quiet=True)
    with FakeOpenAI(("status", 404, {"detail": "Model `served` not found"})) as server:
        with pytest.raises(EngineError, match="refused every request.*HTTP 404.*Model `served` not found"):
            rollout.run(questions(2), cfg(server, tiny_model, group_size=1), ctx)
        assert len(server.requests) == 2  # each refusal read once: nothing to retry, nothing to learn
    # once the server has answered, a refusal is one request's problem again
    ok = vllm_like(tok)
    replies = iter([None, 400, 400, 400])
    with FakeOpenAI(lambda body, path: next(replies, None) or ok(body, path)) as server:
        engine = OpenAIEngine("openai:x", server.base_url + "/completions", "served", tok, concurrency=1)
        ids = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        assert engine.generate([GenRequest(ids, 64)])[0].stop == "eos"
        assert [r.stop for r in engine.generate([GenRequest(ids, 64)] * 2)] == ["error", "error"]


def test_a_text_prompt_leaves_out_the_bos_the_server_adds():
    from atomcli.engines.openai import _added_prefix

    class BosTok:  # a tokenizer that, like Llama's, starts what it tokenizes with BOS (id 1)
        eos_token_id = 2

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": ([1] if add_special_tokens else []) + [ord(ch) for ch in text]}

        def decode(self, ids, skip_special_tokens=False):
            return "".join("<s>" if i == 1 else chr(i) for i in ids)
    tok = BosTok()
    assert _added_prefix(tok) == [1]
    engine = OpenAIEngine("openai:x", "http://127.0.0.1:9/completions", "m", tok, prompt_ids=False)
    assert engine.body(GenRequest([1, ord("h"), ord("i")], 4))["prompt"] == "hi"
    assert engine.body(GenRequest([ord("h"), ord("i")], 4))["prompt"] == "hi"
