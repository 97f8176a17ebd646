"""The rollout stage: exact token columns, masks around real tool responses, episode endings,
seeds, resume and shards.

Every trajectory is checked against the contract (`check_row`): equal column lengths,
decode(prompt_ids + completion_ids) == the chat rendering of `messages`, one mask-1 run per
assistant turn whose text is that turn, tool responses only under mask 0, and old_logprobs
equal to a fresh (unbatched, uncached) forward pass of the same model within 1e-3.
A random tiny model almost never writes a tool call, so `Scripted` (a test-only policy: the
tiny model's logits plus a large bonus on the next token of a script) drives real tool calls
through the real engine, agent and local search index.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import atom

from atomcli import plugins, schema
from atomcli.agent import episode
from atomcli.agent.episode import FORCED_ANSWER
from atomcli.agent import format as agent_format
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import rollout, rollout_io

CORPUS = [
    {"id": "d1", "title": "Alice Smith", "contents": "Alice Smith was born in Paris in 1901. She was a painter."},
    {"id": "d2", "title": "Bob Jones", "contents": "Bob Jones lives in Rome and writes novels."},
    {"id": "d3", "title": "Carol White", "contents": "Carol White founded the Lyon observatory in 1950."},
]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("index")
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    atom("index", d / "corpus.jsonl", "--out", d / "idx.sqlite", check=True)
    return d / "idx.sqlite"


@pytest.fixture(scope="module")
def loaded(tiny_model):
    ctx = Context(quiet=True)
    model, tok = ctx.model(str(tiny_model))
    return ctx, model, tok


@plugins.register_search("fakesearch")
def _fake_search(arg, context, **_):
    class Backend:
        name = "fakesearch"
        traits = plugins.SearchTraits("fakesearch")

        def read_local(self, url):
            return None

        def search(self, query, k):
            return [{"title": f"About {query} {i}", "url": f"https://example.org/{i}", "snippet": "é snippet"}
                    for i in range(k)]
    return Backend()


def questions(n: int) -> pa.Table:
    return pa.table({"id": [f"q{i}" for i in range(n)],
                     "question": [f"Where was person {i} born?" for i in range(n)],
                     "golden_answers": [["Paris"]] * n, "data_source": ["test"] * n})


def config(model, **kw) -> rollout.RolloutConfig:
    base = dict(model=str(model), search="fakesearch", group_size=2, max_turns=2, max_new_tokens=8, k=2,
                date="2026-01-01", batch_size=8, temperature=1.0)
    return rollout.RolloutConfig(**{**base, **kw})


# --- the contract checker -----------------------------------------------------------------------

def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of equal mask values: (value, start, end)."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def fresh_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)


def check_row(row: dict, model, tok) -> None:
    p, c, m, lp = row["prompt_ids"], row["completion_ids"], row["loss_mask"], row["old_logprobs"]
    assert len(c) == len(m) == len(lp) > 0
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert decode(p + c) == tok.apply_chat_template(row["messages"], tokenize=False)
    # the prompt is system + user + the generation prompt
    assert decode(p) == tok.apply_chat_template(row["messages"][:2], tokenize=False, add_generation_prompt=True)
    # one sampled run per assistant turn, whose text is the turn (plus a sampled end-of-turn token)
    assistants = [x["content"] for x in row["messages"] if x["role"] == "assistant"]
    sampled = [(s, e) for v, s, e in runs(m) if v == 1]
    assert len(sampled) == len(assistants) == row["n_turns"]
    for k, ((s, e), content) in enumerate(zip(sampled, assistants)):
        text = decode(c[s:e])
        if row["finish_reason"] == FORCED_ANSWER and k == len(assistants) - 1:
            # a forced answer turn: the environment wrote its head (mask 0), the policy the rest
            head = agent_format.forced_answer_head()
            assert content.startswith(head) and decode(c[:s]).endswith(head) and m[s - 1] == 0
            content = content[len(head):]
        assert text == content or (c[e - 1] == tok.eos_token_id and text == content + tok.eos_token)
    # tool responses arrive only under mask 0
    glue = [decode(c[s:e]) for v, s, e in runs(m) if v == 0]
    tools = [x["content"] for x in row["messages"] if x["role"] == "tool"]
    assert all(t.startswith("<tool_response>") for t in tools)
    joined = "\x00".join(glue)
    for t in tools:
        assert t in joined
    # old_logprobs: a fresh forward pass on the whole sequence, 0.0 where not sampled
    ref = fresh_logprobs(model, p + c)[len(p) - 1:]
    got = torch.tensor(lp)
    mask = torch.tensor(m, dtype=torch.bool)
    assert torch.all(got[~mask] == 0)
    assert torch.allclose(got[mask], ref[mask], atol=1e-3, rtol=0), (got[mask] - ref[mask]).abs().max()
    assert row["format_ok"] == agent_format.trajectory_format_ok(row["messages"])
    assert row["traj_id"] == f"{row['group_id']}/{row['sample_idx']}"


# --- the scripted policy ------------------------------------------------------------------------

class Scripted(torch.nn.Module):
    """Test-only policy: the tiny model's logits plus `bonus` on the next token of a script.

    Turn k (the k-th `<|im_start|>assistant\\n` in the sequence) is forced to `turns[k]`
    followed by the end-of-sequence token. The bonus depends only on the token prefix, so a
    fresh forward pass reproduces the sampling logits exactly, as for any real model."""

    def __init__(self, inner, tok, turns: list[str], bonus: float = 40.0):
        super().__init__()
        self.inner, self.config, self.generation_config = inner, inner.config, inner.generation_config
        self.turns = [tok(t, add_special_tokens=False)["input_ids"] for t in turns]
        self.opening = tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        self.eos, self.bonus = tok.eos_token_id, bonus

    @property
    def device(self):
        return self.inner.device

    def forced(self, seq: list[int]) -> list[int | None]:
        """The forced next token after each prefix seq[:i+1]."""
        out, k, start, n = [], 0, None, len(self.opening)
        for i in range(len(seq)):
            if seq[max(0, i - n + 1):i + 1] == self.opening:
                k, start = k + 1, i + 1
            if start is None:
                out.append(None)
                continue
            turn = self.turns[k - 1] if k - 1 < len(self.turns) else []
            j = i + 1 - start
            out.append(turn[j] if j < len(turn) else self.eos)
        return out

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0, **kw):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep)
        rows = input_ids.tolist()
        if attention_mask is not None:  # drop the left padding of the new tokens
            new_mask = attention_mask[:, -input_ids.shape[1]:].tolist()
            rows = [[t for t, a in zip(r, m) if a] for r, m in zip(rows, new_mask)]
        if cache is not None:
            # the tokens this cache row already holds (set by `remember_cached_prefixes`), then ours
            hist = getattr(cache, "script_history", None) or [[] for _ in rows]
            hist = cache.script_history = [h + r for h, r in zip(hist, rows)]
            if not getattr(cache, "script_follows", False):  # follow the engine's row selection
                cache.script_follows = True
                select = cache.batch_select_indices

                def select_too(idx, select=select):
                    select(idx)
                    cache.script_history = [cache.script_history[i] for i in idx.tolist()]
                cache.batch_select_indices = select_too
        else:
            hist = rows
        logits = out.logits.clone()
        kept = logits.shape[1]
        for b, seq in enumerate(hist):
            for pos, f in enumerate(self.forced(seq)[-kept:]):
                if f is not None:
                    logits[b, pos, f] += self.bonus
        return SimpleNamespace(logits=logits)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny model's matmuls are too small for threads; on a shared machine OpenMP threads
    waiting for each other make them 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def remember_cached_prefixes(monkeypatch):
    """Tell `Scripted` which tokens a reused KV cache stands for (a real model needs no telling:
    the KV is its memory of them; the script, kept outside the model, does)."""
    from atomcli.engines.hf import HFEngine
    assemble = HFEngine._assemble

    def tracking(self, reqs, live, pasts):
        cache, *rest = assemble(self, reqs, live, pasts)
        cache.script_history = [list(reqs[i].ids[:pasts[i][0]]) for i in live]
        return (cache, *rest)
    monkeypatch.setattr(HFEngine, "_assemble", tracking)


SCRIPT = [
    '<think><PLAN>find Alice</PLAN></think>\n<tool_call>{"name": "web_search", "arguments": '
    '{"query": ["Alice Smith"]}}</tool_call> and words the engine must never sample',
    '<think><REFLECTION>read the page</REFLECTION></think>\n<tool_call>{"name": "browse_webpage", '
    '"arguments": {"url_list": ["local://doc/d1"], "query": "birthplace"}}</tool_call>',
    '<think>oops</think><tool_call>{"name": "web_search", "arguments": {"query": [</tool_call>',
    '<think>nothing to call</think>',
    '<think><OBSERVATION>born in Paris</OBSERVATION></think>\n<answer>Paris</answer>',
]


def scripted_run(loaded, index, turns, **kw):
    ctx, model, tok = loaded
    spec = "scripted:" + str(len(ctx._cache))
    policy = Scripted(model, tok, turns)
    ctx.cached(("model", spec, ()), lambda: (policy, tok))  # what context.model(spec) will return
    cfg = config(spec, **{"search": f"local:{index}", "group_size": 1, "max_turns": 6, "max_new_tokens": 64, **kw})
    return rollout.run(questions(1), cfg, ctx), policy, tok


def test_scripted_tool_calls_exact_tokens_and_masks(loaded, index):
    table, policy, tok = scripted_run(loaded, index, SCRIPT)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 4 + ["assistant"]
    # generation stopped at the token that completed </tool_call>: the rest of turn 1 was never sampled
    assert [m["content"] for m in row["messages"] if m["role"] == "assistant"] == [
        SCRIPT[0][:SCRIPT[0].index("</tool_call>") + len("</tool_call>")]] + SCRIPT[1:]
    assert (row["finish_reason"], row["answer"], row["n_turns"]) == ("answer", "Paris", 5)
    assert (row["n_search"], row["n_browse"]) == (1, 1)
    calls = row["tool_calls"]
    assert [(c["turn"], c["name"], c["ok"]) for c in calls] == [
        (1, "web_search", True), (2, "browse_webpage", True), (3, "", False), (4, "", False)]
    assert json.loads(calls[0]["arguments"]) == {"query": ["Alice Smith"]}
    assert "invalid JSON" in calls[2]["error"] and calls[2]["arguments"].startswith('{"name"')
    assert "without <tool_call>" in calls[3]["error"]
    tools = [m["content"] for m in row["messages"] if m["role"] == "tool"]
    assert "Alice Smith" in tools[0] and "local://doc/d1" in tools[0]
    assert "born in Paris" in tools[1]
    assert "Error:" in tools[2] and "Error:" in tools[3]
    # the turn without an action ended with a sampled end-of-turn token: mask 1, kept in the ids
    sampled = [(s, e) for v, s, e in runs(row["loss_mask"]) if v == 1]
    s, e = sampled[3]
    assert row["completion_ids"][e - 1] == tok.eos_token_id
    # ... while the tool-call turns end exactly at the token that completes </tool_call>
    for s, e in sampled[:3]:
        assert tok.decode(row["completion_ids"][s:e]).endswith("</tool_call>")
    # and the answer turn is closed by template glue (mask 0), as the template renders it
    assert row["loss_mask"][-1] == 0 and row["format_ok"] is False


def test_max_turns_does_not_run_the_last_call(loaded, index):
    table, policy, tok = scripted_run(loaded, index, SCRIPT[:2], max_turns=2)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert row["finish_reason"] == "max_turns" and row["answer"] is None and row["n_turns"] == 2
    assert [c["name"] for c in row["tool_calls"]] == ["web_search"]
    assert row["messages"][-1]["role"] == "assistant"


def test_last_turn_note_comes_before_the_last_turn_only(loaded, index):
    note = agent_format.LAST_TURN_NOTE
    table, policy, tok = scripted_run(loaded, index, SCRIPT[:2] + SCRIPT[-1:], max_turns=3, last_turn_note=True)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)  # the note is environment text: mask 0, tokens as the template renders them
    tools = [m["content"] for m in row["messages"] if m["role"] == "tool"]
    assert [t.endswith("</tool_response>\n" + note) for t in tools] == [False, True]
    assert (row["finish_reason"], row["answer"]) == ("answer", "Paris")
    # the same script without the note: no message carries it
    table, *_ = scripted_run(loaded, index, SCRIPT[:2] + SCRIPT[-1:], max_turns=3)
    assert not any(note in (m["content"] or "") for m in table.to_pylist()[0]["messages"])
    # a one-turn budget: the question itself carries it
    table, policy, tok = scripted_run(loaded, index, SCRIPT[-1:], max_turns=1, last_turn_note=True)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert row["messages"][1]["content"].endswith("\n" + note) and row["answer"] == "Paris"


def test_force_answer_after_a_last_turn_that_calls_a_tool(loaded, index):
    head = agent_format.forced_answer_head()
    table, policy, tok = scripted_run(loaded, index, SCRIPT[:2] + [head + "Paris</answer>"], max_turns=2,
                                      force_answer=True)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)  # token columns, masks and log-probs exact; the head is mask 0
    assert (row["finish_reason"], row["answer"], row["n_turns"], row["format_ok"]) == (
        FORCED_ANSWER, "Paris", 3, True)
    assert [c["name"] for c in row["tool_calls"]] == ["web_search"]  # the last turn's call was not run
    assert [m["role"] for m in row["messages"]] == ["system", "user"] + ["assistant", "tool"] * 2 + ["assistant"]
    assert row["messages"][-2]["content"] == agent_format.tool_message(agent_format.NOT_RUN, last_turn=True)
    assert row["messages"][-1]["content"] == head + "Paris</answer>"
    # a last turn that answers on its own is untouched
    table, policy, tok = scripted_run(loaded, index, SCRIPT[:1] + SCRIPT[-1:], max_turns=2, force_answer=True)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert (row["finish_reason"], row["answer"], row["n_turns"]) == ("answer", "Paris", 2)
    # a forced turn that does not close its answer ends at the cap, unanswered
    table, policy, tok = scripted_run(loaded, index, SCRIPT[:2] + [head + "Paris"], max_turns=2,
                                      force_answer=True)
    row = table.to_pylist()[0]
    assert (row["finish_reason"], row["answer"], row["n_turns"]) == ("max_turns", None, 3)


def test_force_answer_without_room_ends_with_length_on_the_tool_message(loaded, index):
    head = agent_format.forced_answer_head()
    turns = SCRIPT[:2] + [head + "Paris</answer>"]
    table, policy, tok = scripted_run(loaded, index, turns, max_turns=2, force_answer=True)
    row = table.to_pylist()[0]
    mask = row["loss_mask"]
    last_run = max(i for i in range(len(mask)) if mask[i] == 1 and (i == 0 or mask[i - 1] == 0))
    # the forced turn's opening and head end exactly at the cap: no room for the policy's answer
    table, policy, tok = scripted_run(loaded, index, turns, max_turns=2, force_answer=True,
                                      max_context=len(row["prompt_ids"]) + last_run)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert (row["finish_reason"], row["answer"], row["n_turns"]) == ("length", None, 2)
    last = row["messages"][-1]
    assert (last["role"], last["content"]) == ("tool", agent_format.tool_message(agent_format.NOT_RUN, True))


def test_context_cap_ends_with_length(loaded, index):
    ctx, model, tok = loaded
    prompt = len(tok(tok.apply_chat_template(
        [{"role": "system", "content": agent_format.system_prompt("2026-01-01")},
         {"role": "user", "content": agent_format.user_message("Where was person 0 born?")}],
        tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"])
    # the cap cuts the first turn
    table, policy, tok = scripted_run(loaded, index, SCRIPT, max_context=prompt + 10)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert row["finish_reason"] == "length" and row["n_turns"] == 1 and sum(row["loss_mask"]) == 10
    # the first turn fits, the tool response fills the rest: the conversation ends on the tool message
    table, policy, tok = scripted_run(loaded, index, SCRIPT, max_context=prompt + 80)
    row = table.to_pylist()[0]
    check_row(row, policy, tok)
    assert row["finish_reason"] == "length" and row["messages"][-1]["role"] == "tool"
    assert len(row["prompt_ids"]) + len(row["completion_ids"]) >= prompt + 80 - 5


# --- the random tiny model through the CLI ------------------------------------------------------

def test_cli_rollout_eight_questions_group_four(tiny_model, index, loaded, tmp_path):
    ctx, model, tok = loaded
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Who is person {i}?",
                                      "golden_answers": ["x"]}) + "\n" for i in range(8)))
    out = tmp_path / "r.parquet"
    proc = atom("rollout", qs, "--model", tiny_model, "--search", f"local:{index}", "--group-size", 4,
                "--max-new-tokens", 10, "--max-turns", 2, "--date", "2026-01-01", "--out", out, check=True,
                env={"OMP_NUM_THREADS": "1"})
    assert proc.stdout == b""
    table = pq.read_table(out)
    rows = table.to_pylist()
    assert len(rows) == 32
    assert [r["traj_id"] for r in rows] == [f"q{i}/{s}" for i in range(8) for s in range(4)]
    for r in rows:
        check_row(r, model, tok)
        assert r["policy"] == str(tiny_model) and r["finish_reason"] in ("answer", "max_turns", "length")
    # the table records which tokenizer its token columns belong to
    rec = schema.token_source(table)
    from atomcli import models
    assert rec["stage"] == "rollout" and rec["tokenizer"] == models.tokenizer_id(tok)
    assert rec["config"]["group_size"] == 4 and rec["engine"] == "hf" and rec["tokens"] == "exact"
    assert not (tmp_path / ".r.parquet.partial").exists()


def test_cli_bad_shard_is_a_usage_error(tiny_model, index, tmp_path):
    qs = tmp_path / "q.jsonl"
    qs.write_text(json.dumps({"id": "a", "question": "q?", "golden_answers": ["x"]}) + "\n")
    proc = atom("rollout", qs, "--model", tiny_model, "--search", f"local:{index}", "--shard", "2/2",
                "--out", tmp_path / "r.parquet")
    assert proc.returncode == 2 and b"--shard" in proc.stderr
    assert not (tmp_path / "r.parquet").exists()


# --- seeds, resume, shards ----------------------------------------------------------------------

def token_columns(table: pa.Table) -> list[tuple]:
    return [(r["traj_id"], r["completion_ids"], r["old_logprobs"]) for r in table.to_pylist()]


def sampled_ids(table: pa.Table) -> list[tuple]:
    """What was sampled, per trajectory. Across different batch shapes the logits (and so the
    log-probs) may differ in the last bits, but the samples drawn from them do not."""
    return [(r["traj_id"], r["completion_ids"]) for r in table.to_pylist()]


def test_same_seed_same_output(loaded):
    ctx, model, tok = loaded
    t = questions(2)
    a = rollout.run(t, config(model.atom_spec, seed=3), ctx)
    b = rollout.run(t, config(model.atom_spec, seed=3), ctx)
    c = rollout.run(t, config(model.atom_spec, seed=4), ctx)
    assert token_columns(a) == token_columns(b)
    assert [x[1] for x in token_columns(a)] != [x[1] for x in token_columns(c)]
    # the samples of one trajectory do not depend on what shares its batch
    d = rollout.run(t, config(model.atom_spec, seed=3, batch_size=1), ctx)
    assert sampled_ids(a) == sampled_ids(d)
    for r in a.to_pylist():
        check_row(r, model, tok)


def test_old_logprobs_are_the_policy_not_the_sampling_distribution(loaded):
    # with temperature and top-p the sampler draws from a reshaped distribution, but the
    # recorded log-probs are the model's own (what a fresh forward pass and GRPO compute)
    ctx, model, tok = loaded
    t = rollout.run(questions(1), config(model.atom_spec, temperature=0.7, top_p=0.9, max_new_tokens=12), ctx)
    for r in t.to_pylist():
        check_row(r, model, tok)


def test_greedy_samples_are_identical_within_a_group(loaded):
    ctx, model, tok = loaded
    t = rollout.run(questions(1), config(model.atom_spec, temperature=0.0, group_size=3), ctx)
    cols = [r["completion_ids"] for r in t.to_pylist()]
    assert cols[0] == cols[1] == cols[2]


class Crash(Exception):
    pass


def test_resume_after_crash_keeps_completed_groups(loaded, tmp_path):
    ctx, model, tok = loaded
    t = questions(4)
    cfg = config(model.atom_spec, seed=1)
    out = tmp_path / "r.parquet"

    class Crashing:  # the rollout module, but the process "dies" after two groups were persisted
        validate, group_ids, provenance_fields = rollout.validate, rollout.group_ids, rollout.provenance_fields

        @staticmethod
        def run(table, cfg, ctx, *, done_groups=frozenset(), sink=None):
            seen = []

            def dying_sink(group):
                sink(group)
                seen.append(group)
                if len(seen) == 2:
                    raise Crash()
            return rollout.run(table, cfg, ctx, done_groups=done_groups, sink=dying_sink)

    with pytest.raises(Crash):
        rollout_io.run_to_file(Crashing, t, cfg, ctx, out=str(out), fmt=None, resume=False)
    assert not out.exists()
    partial = rollout_io.partial_dir(str(out))
    kept = pa.concat_tables([pq.read_table(f) for f in sorted(partial.glob("*.parquet"))])
    assert sorted(set(kept.column("group_id").to_pylist())) == ["q0", "q1"]

    calls = []

    class Spy:
        validate, group_ids, provenance_fields = rollout.validate, rollout.group_ids, rollout.provenance_fields

        @staticmethod
        def run(table, cfg, ctx, **kw):
            calls.append(kw["done_groups"])
            return rollout.run(table, cfg, ctx, **kw)

    final = rollout_io.run_to_file(Spy, t, cfg, ctx, out=str(out), fmt=None, resume=True)
    assert calls == [frozenset({"q0", "q1"})]
    assert not partial.exists()
    written = pq.read_table(out)
    assert [r["traj_id"] for r in written.to_pylist()] == [f"q{i}/{s}" for i in range(4) for s in range(2)]
    # the groups made before the crash are kept as they were, and equal an uninterrupted run
    by_id = {r["traj_id"]: r for r in written.to_pylist()}
    for r in kept.to_pylist():
        assert by_id[r["traj_id"]]["completion_ids"] == r["completion_ids"]
    assert sampled_ids(written) == sampled_ids(rollout.run(t, cfg, ctx))
    assert schema.token_source(final)["stage"] == "rollout"
    # resuming a finished file does no new work
    calls.clear()
    rollout_io.run_to_file(Spy, t, cfg, ctx, out=str(out), fmt=None, resume=True)
    assert calls == [frozenset(f"q{i}" for i in range(4))]
    assert token_columns(pq.read_table(out)) == token_columns(written)


def test_shards_concatenate_to_the_full_set(loaded, tmp_path):
    ctx, model, tok = loaded
    t = questions(5)
    full = rollout.run(t, config(model.atom_spec, seed=2), ctx)
    parts = [rollout.run(t, config(model.atom_spec, seed=2, shard=f"{i}/2"), ctx) for i in range(2)]
    assert [r["group_id"] for r in parts[0].to_pylist()][::2] == ["q0", "q2", "q4"]
    merged = pa.concat_tables(parts)
    assert sorted(sampled_ids(merged)) == sorted(sampled_ids(full))
    limited = rollout.run(t, config(model.atom_spec, seed=2, limit=2), ctx)
    assert sampled_ids(limited) == sampled_ids(full)[:4]


# --- units --------------------------------------------------------------------------------------

def test_group_ids_are_unique_and_deterministic():
    t = pa.table({"id": ["a", "b", "a", "a~2", "a"]})
    assert rollout.group_ids(t) == ["a", "b", "a~2", "a~2~", "a~3"]
    assert rollout.group_ids(t) == rollout.group_ids(t)


def test_selected_rows_limit_and_shard():
    t = questions(7)
    assert rollout.selected_rows(t, rollout.RolloutConfig(shard="1/3")) == [1, 4]
    assert rollout.selected_rows(t, rollout.RolloutConfig(limit=5, shard="0/2")) == [0, 2, 4]
    for bad in ("3/3", "x", "1/0", "-1/2"):
        with pytest.raises(InputError):
            rollout.parse_shard(bad)


def test_input_columns_pass_through(loaded):
    ctx, model, tok = loaded
    t = questions(2)
    out = rollout.run(t, config(model.atom_spec, group_size=3, max_turns=1), ctx)
    assert out.column_names[:4] == t.column_names
    assert out.column("data_source").to_pylist() == ["test"] * 6
    assert out.column("question").to_pylist() == [q for q in t.column("question").to_pylist() for _ in range(3)]
    assert out.schema.field("completion_ids").type == schema.COLUMNS["completion_ids"].type


def test_template_that_rewrites_old_turns_is_refused(loaded):
    ctx, model, tok = loaded

    class Rewriting:  # like templates that drop earlier <think> blocks once a new turn starts
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
            n = len(messages)
            parts = [m["content"] if not (m["role"] == "assistant" and i < n - 1) else "[old turn]"
                     for i, m in enumerate(messages)]
            return "|".join(parts) + ("|A:" if add_generation_prompt else "")

    with pytest.raises(InputError, match="re-renders earlier turns"):
        episode.Chat(Rewriting()).check("system")
    episode.Chat(tok).check("system")  # SmolLM2's ChatML template is append-only


def test_bad_config_fails_before_loading(loaded):
    ctx, model, tok = loaded
    for kw in ({"group_size": 0}, {"top_p": 0.0}, {"temperature": -1.0}, {"max_turns": 0}):
        with pytest.raises(InputError):
            rollout.run(questions(1), config("/nonexistent/model", **kw), ctx)


def test_kv_reuse_gives_the_same_samples_with_less_prefill(loaded):
    from atomcli.engines.base import GenRequest
    from atomcli.engines.hf import HFEngine
    ctx, model, tok = loaded
    shared = list(range(1000, 1060))  # a common prompt prefix (like the system prompt)
    contexts = {f"t{i}": shared + [2000 + i] * (i + 1) for i in range(3)}
    engines = {reuse: HFEngine("tiny", model, tok, reuse_kv=reuse) for reuse in (True, False)}
    out = {}
    for reuse, engine in engines.items():
        ctxs = dict(contexts)
        turns = []
        for turn in range(3):  # each turn continues the last one, plus some "glue" tokens
            reqs = [GenRequest(ids, 6, seed=turn, key=key) for key, ids in ctxs.items()]
            res = engine.generate(reqs)
            turns.append([(r.ids, r.logprobs) for r in res])
            ctxs = {k: ids + r.ids + [3000 + turn] * 4 for (k, ids), r in zip(ctxs.items(), res)}
        out[reuse] = turns
    for a, b in zip(out[True], out[False]):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(a, b):
            assert ids_a == ids_b
            assert torch.allclose(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-4)
    assert engines[True].prefilled_tokens < engines[False].prefilled_tokens / 3
    assert set(engines[True].sessions) == set(contexts) and engines[True].prefixes
    for key in contexts:
        engines[True].release(key)
    assert not engines[True].sessions


def test_a_finished_rows_place_is_taken_at_once_with_the_same_samples(loaded):
    """Six requests through 2 rows: each finished row's successor joins the running batch (its KV ending where the
    others' does, shorter or longer than theirs), and every request samples what it samples with all in one batch."""
    from atomcli.engines.base import GenRequest
    from atomcli.engines.hf import HFEngine
    ctx, model, tok = loaded
    shared = list(range(1000, 1040))
    contexts = {f"t{i}": shared + [2000 + i] * (3 * i + 1) for i in range(6)}
    caps = [2, 9, 3, 8, 4, 7]
    out = {}
    for rows in (2, 16):
        engine = HFEngine("tiny", model, tok, batch_size=rows)
        ctxs, turns = dict(contexts), []
        for turn in range(2):   # the second turn reuses each trajectory's KV from the first
            reqs = [GenRequest(ids, cap, seed=7 + k, temperature=1.0, key=key)
                    for k, ((key, ids), cap) in enumerate(zip(ctxs.items(), caps))]
            res = engine.generate(reqs)
            turns.append([(r.ids, r.logprobs, r.stop) for r in res])
            ctxs = {k: ids + r.ids + [3000 + turn] * (2 + len(k)) for (k, ids), r in zip(ctxs.items(), res)}
        out[rows] = turns, engine
    for a, b in zip(out[2][0], out[16][0]):
        for (ids_a, lp_a, stop_a), (ids_b, lp_b, stop_b) in zip(a, b):
            assert ids_a == ids_b and stop_a == stop_b
            torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), rtol=0, atol=1e-4)
    two = out[2][1]
    assert two.row_steps / (2 * two.decode_steps) > 0.85   # the two rows stay busy until the queue is empty


def test_bf16_precision_samples_with_a_bfloat16_copy_of_the_policy(tiny_model):
    """--precision bf16 samples with a bfloat16 copy (the fp32 policy stays as it is); the recorded log-probs are
    that copy's, close to an fp32 pass; an unknown precision is refused naming the valid ones."""
    ctx = Context(quiet=True)
    t = rollout.run(questions(2), config(str(tiny_model), precision="bf16", max_new_tokens=12), ctx)
    cast, tok = ctx.model(str(tiny_model), dtype="bfloat16")
    fp32, _ = ctx.model(str(tiny_model))
    assert {p.dtype for p in cast.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    for r in t.to_pylist():
        ids, n = r["prompt_ids"] + r["completion_ids"], len(r["prompt_ids"])
        mask = torch.tensor(r["loss_mask"], dtype=torch.bool)
        got = torch.tensor(r["old_logprobs"])[mask]
        assert torch.all(torch.tensor(r["old_logprobs"])[~mask] == 0)
        drift = (got - fresh_logprobs(fp32, ids)[n - 1:][mask]).abs()
        assert 0 < drift.max() < 0.1, drift.max()  # bf16's, not fp32's, and close to them
    with pytest.raises(InputError, match="valid: bf16, fp32"):
        rollout.validate(config(str(tiny_model), precision="fp16"))
