"""score-ig: turn rewards against a direct forward pass of the tiny model, aliases, modes, failures, the CLI."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import atom

from atomcli import models, schema
from atomcli.agent import format as agent_format
from atomcli.agent.episode import turn_spans
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import score_ig

SYSTEM = "Research agent."
TURN1 = ('<think><PLAN>search for the founder of Xylo Works</PLAN></think><tool_call>{"name": "web_search", '
         '"arguments": {"query": ["Xylo Works founder"]}}</tool_call>')
OBS = agent_format.tool_message("1. Xylo Works was founded by Ana Berg in 1901.")
TURN2 = "<think><OBSERVATION>the page names Ana Berg</OBSERVATION></think><answer>Ana Berg</answer>"


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def model(tiny_model):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32).eval()


def enc(tok, s):
    return tok(s, add_special_tokens=False)["input_ids"]


def two_turn_row(tok, golden=("Ana Berg",)):
    """A search turn, its tool response, an answer turn: token columns the way a rollout writes them."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Question: Who founded Xylo Works?"}]
    prompt = enc(tok, tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    pieces = [(TURN1 + "<|im_end|>", 1), (f"\n<|im_start|>tool\n{OBS}<|im_end|>\n<|im_start|>assistant\n", 0),
              (TURN2 + "<|im_end|>", 1)]
    comp, mask = [], []
    for text, m in pieces:
        ids = enc(tok, text)
        comp += ids
        mask += [m] * len(ids)
    messages += [{"role": "assistant", "content": TURN1}, {"role": "tool", "content": OBS},
                 {"role": "assistant", "content": TURN2}]
    return {"traj_id": "q1/0", "group_id": "q1", "golden_answers": list(golden), "messages": messages,
            "prompt_ids": prompt, "completion_ids": comp, "loss_mask": mask, "n_turns": 2}


def make_table(tok, rows, policy):
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    cols["policy"] = [policy] * len(rows)
    t = pa.table({k: schema.array(k, v) for k, v in cols.items()})
    return schema.with_provenance(t, "rollout", {}, model=policy, tokenizer=models.tokenizer_id(tok))


def direct_score(model, tok, context, gold):
    """Mean log-prob of the golden answer's tokens after `context`, from the full logits of one plain pass."""
    text, (a, _) = agent_format.forced_answer_turn(gold)
    head, answer = enc(tok, text[:a]), enc(tok, gold)
    assert enc(tok, text + "<|im_end|>\n")[:len(head) + len(answer)] == head + answer  # the pieces are the tokens
    seq = context + head + answer
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].double(), -1)
    first = len(context) + len(head)
    return sum(lp[first + k - 1, answer[k]].item() for k in range(len(answer))) / len(answer)


def expected_contexts(tok, row):
    """The three contexts by hand: the bare prompt, after turn 1 (up to turn 2's first sampled token), and after
    turn 2 (the whole trajectory, the template's newline and a newly opened assistant turn)."""
    p, c, m = row["prompt_ids"], row["completion_ids"], row["loss_mask"]
    second = m.index(1, m.index(0))  # first sampled token of turn 2
    return [p, p + c[:second], p + c + enc(tok, "\n<|im_start|>assistant\n")]


def quiet():
    return Context(quiet=True)


# --- against a direct forward pass ------------------------------------------------------------------

@pytest.mark.parametrize("reuse_prefix", [True, False])
@pytest.mark.parametrize("mode", ["prob", "logprob"])
def test_turn_ig_matches_a_direct_forward_pass(tiny_model, tok, model, reuse_prefix, mode):
    row = two_turn_row(tok)
    scores = [direct_score(model, tok, ctx, "Ana Berg") for ctx in expected_contexts(tok, row)]
    v = [math.exp(s) for s in scores] if mode == "prob" else scores
    want = [v[1] - v[0], v[2] - v[1]]
    assert abs(want[0]) > 1e-9 and abs(want[1]) > 1e-9  # the contexts really differ

    out = score_ig.run(make_table(tok, [row], str(tiny_model)),
                       score_ig.IGConfig(ig=mode, reuse_prefix=reuse_prefix), quiet()).to_pylist()[0]
    assert out["ig_error"] is None
    tol = dict(rel=1e-3, abs=1e-10) if mode == "prob" else dict(rel=1e-4, abs=1e-5)
    assert out["turn_ig"] == pytest.approx(want, **tol)
    assert out["ig"] == pytest.approx(sum(want), **tol)
    assert out["ig"] == pytest.approx(v[2] - v[0], **tol)  # the gains telescope


def test_a_forced_answer_turn_is_scored_after_its_context_not_its_head(tiny_model, tok, model):
    """rollout --force-answer writes the answer turn's head (mask 0): the context before that turn ends before it."""
    row = two_turn_row(tok)
    head = agent_format.forced_answer_head()
    n_head = len(enc(tok, head))
    turn2 = "Ana Berg</answer>"
    p, c, m = row["prompt_ids"], row["completion_ids"], row["loss_mask"]
    second = m.index(1, m.index(0))
    comp = c[:second] + enc(tok, head) + enc(tok, turn2 + "<|im_end|>")
    mask = m[:second] + [0] * n_head + [1] * (len(comp) - second - n_head)
    messages = row["messages"][:-1] + [{"role": "assistant", "content": head + turn2}]
    forced = {**row, "completion_ids": comp, "loss_mask": mask, "messages": messages, "finish_reason": "forced_answer"}
    ctxs = [p, p + c[:second], p + comp + enc(tok, "\n<|im_start|>assistant\n")]
    v = [direct_score(model, tok, ctx, "Ana Berg") for ctx in ctxs]
    out = score_ig.run(make_table(tok, [forced], str(tiny_model)), score_ig.IGConfig(ig="logprob"),
                       quiet()).to_pylist()[0]
    assert out["ig_error"] is None
    assert out["turn_ig"] == pytest.approx([v[1] - v[0], v[2] - v[1]], rel=1e-4, abs=1e-5)
    # the same row read as an ordinary answer turn puts the head inside turn 1's context: a different number
    plain = score_ig.run(make_table(tok, [{**forced, "finish_reason": "answer"}], str(tiny_model)),
                         score_ig.IGConfig(ig="logprob"), quiet()).to_pylist()[0]
    assert abs(plain["turn_ig"][0] - out["turn_ig"][0]) > 1e-4


def test_the_best_alias_counts_per_context(tiny_model, tok, model):
    golden = ("Ana Berg", "A. Berg", "Berg")
    row = two_turn_row(tok, golden)
    best = [max(direct_score(model, tok, ctx, g) for g in golden) for ctx in expected_contexts(tok, row)]
    out = score_ig.run(make_table(tok, [row], str(tiny_model)), score_ig.IGConfig(ig="logprob"),
                       quiet()).to_pylist()[0]
    assert out["turn_ig"] == pytest.approx([best[1] - best[0], best[2] - best[1]], rel=1e-4, abs=1e-5)


def test_batched_plain_path_equals_the_cached_one_on_many_rows(tiny_model, tok):
    rows = [two_turn_row(tok, g) for g in (("Ana Berg",), ("Lunmark", "the Ilse"), ("1887",))]
    rows[1] = {**rows[1], "traj_id": "q1/1"}
    rows[2] = {**rows[2], "traj_id": "q1/2"}
    table = make_table(tok, rows, str(tiny_model))
    a = score_ig.run(table, score_ig.IGConfig(ig="logprob"), quiet()).column("turn_ig").to_pylist()
    b = score_ig.run(table, score_ig.IGConfig(ig="logprob", reuse_prefix=False, batch_size=2),
                     quiet()).column("turn_ig").to_pylist()
    for x, y in zip(a, b):
        assert x == pytest.approx(y, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("reuse_prefix", [True, False])
def test_bf16_scores_are_the_direct_pass_under_autocast(tiny_model, tok, model, reuse_prefix):
    """--precision bf16: the scores are those of a direct forward pass under bf16 autocast (not fp32's),
    on both paths; an unknown precision is a usage error naming the valid ones."""
    row = two_turn_row(tok)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = [direct_score(model, tok, ctx, "Ana Berg") for ctx in expected_contexts(tok, row)]
    full = [direct_score(model, tok, ctx, "Ana Berg") for ctx in expected_contexts(tok, row)]
    assert low != full
    out = score_ig.run(make_table(tok, [row], str(tiny_model)),
                       score_ig.IGConfig(ig="logprob", precision="bf16", reuse_prefix=reuse_prefix),
                       quiet()).to_pylist()[0]
    want_low, want_full = [low[1] - low[0], low[2] - low[1]], [full[1] - full[0], full[2] - full[1]]
    # The scorer's batched (or prefix-reusing) pass has other shapes than the direct one: on a CPU with AMX,
    # bf16 kernels then round differently (1.6e-4 apart here, against 3-5e-4 between bf16 and fp32). So each
    # score must sit well inside the gap between the two precisions, on bf16's side: an fp32 pass fails this.
    for got, lo, hi in zip(out["turn_ig"], want_low, want_full):
        assert abs(got - lo) < 0.6 * abs(hi - lo), (out["turn_ig"], want_low, want_full)
    assert out["turn_ig"] != pytest.approx(want_full, rel=1e-3, abs=5e-5)
    with pytest.raises(InputError, match="valid: auto, bf16, fp32"):
        score_ig.run(make_table(tok, [row], str(tiny_model)), score_ig.IGConfig(precision="fp8"), quiet())


# --- edge cases: never a silent 0 --------------------------------------------------------------------

def test_failures_are_recorded_and_a_turnless_row_is_zero(tiny_model, tok):
    good = two_turn_row(tok)
    no_gold = {**two_turn_row(tok, ()), "traj_id": "q1/1"}
    blank = {**two_turn_row(tok, ("  ",)), "traj_id": "q1/2"}
    drift = {**two_turn_row(tok), "traj_id": "q1/3", "n_turns": 3}
    turnless = {**two_turn_row(tok), "traj_id": "q1/4", "completion_ids": [], "loss_mask": [], "n_turns": 0}
    out = score_ig.run(make_table(tok, [good, no_gold, blank, drift, turnless], str(tiny_model)),
                       score_ig.IGConfig(), quiet()).to_pylist()
    assert out[0]["ig_error"] is None and len(out[0]["turn_ig"]) == 2
    for r in out[1:4]:
        assert r["ig_error"] and r["turn_ig"] is None and r["ig"] is None
    assert "golden" in out[1]["ig_error"] and "golden" in out[2]["ig_error"] and "n_turns" in out[3]["ig_error"]
    assert out[4] == {**out[4], "turn_ig": [], "ig": 0.0, "ig_error": None}


def test_too_long_context_is_a_row_error(tmp_path, tok):
    short = models.make_tiny_model(tmp_path / "short", tokenizer_from=tok.name_or_path)
    import json
    cfg = json.loads((short / "config.json").read_text())
    cfg["max_position_embeddings"] = 64
    (short / "config.json").write_text(json.dumps(cfg))
    out = score_ig.run(make_table(tok, [two_turn_row(tok)], str(short)), score_ig.IGConfig(), quiet()).to_pylist()[0]
    assert out["turn_ig"] is None and "limit is 64" in out["ig_error"]


def test_model_defaults_to_the_policy_and_is_recorded(tiny_model, tok):
    cfg = score_ig.IGConfig()
    table = make_table(tok, [two_turn_row(tok)], str(tiny_model))
    score_ig.run(table, cfg, quiet())
    assert cfg.model == str(tiny_model)  # resolved in place: provenance names the scoring model
    served = make_table(tok, [two_turn_row(tok)], "openai:http://x/v1#m")
    with pytest.raises(InputError, match="served model") as e:
        score_ig.run(served, score_ig.IGConfig(), quiet())
    assert "--model" in e.value.hint


def test_refuses_a_scoring_model_with_another_tokenizer(tiny_model, tok):
    table = make_table(tok, [two_turn_row(tok)], str(tiny_model))
    other = schema.with_provenance(table, "rollout", {}, model="x", tokenizer="OtherTokenizer:1:abc")
    with pytest.raises(InputError, match="tokenizer"):
        score_ig.run(other, score_ig.IGConfig(), quiet())
    with pytest.raises(InputError, match="--ig"):
        score_ig.run(table, score_ig.IGConfig(ig="entropy"), quiet())


def test_turn_spans_are_the_runs_of_sampled_tokens():
    assert turn_spans([]) == []
    assert turn_spans([0, 0]) == []
    assert turn_spans([1, 1, 0, 0, 1, 0, 1]) == [(0, 2), (4, 5), (6, 7)]


# --- command line ------------------------------------------------------------------------------------

def test_cli_writes_the_columns_and_provenance(tiny_model, tok, tmp_path):
    src, dst = tmp_path / "rollouts.parquet", tmp_path / "scored.parquet"
    pq.write_table(make_table(tok, [two_turn_row(tok)], str(tiny_model)), src)
    proc = atom("score-ig", src, "--out", dst, "--ig", "logprob", check=True)
    out = pq.read_table(dst)
    assert len(out.column("turn_ig")[0].as_py()) == 2 and out.column("ig_error")[0].as_py() is None
    rec = schema.provenance(out)[-1]
    assert rec["stage"] == "score-ig" and rec["config"]["model"] == str(tiny_model) and rec["config"]["ig"] == "logprob"
    assert b"score-ig" in proc.stderr and proc.stdout == b""
