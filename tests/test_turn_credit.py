"""Turn-level credit: aggregate-reward --process/--credit on hand-computed groups, grpo-step with
turn_advantages, and run-all with the information-gain process reward end to end."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
import torch
from conftest import atom
from test_grpo_step import make_table

from atomcli import config as cfgmod
from atomcli import schema, tableio
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import aggregate_reward as agg
from atomcli.stages import grpo_step

CTX = Context(quiet=True)


def ig_table(rows: list[dict]) -> pa.Table:
    """Rows for aggregate-reward with score-ig's columns; `turns` = the turn gains (None = scoring failed)."""
    cols = {
        "golden_answers": [["Paris"]] * len(rows),
        "group_id": [r["group"] for r in rows],
        "messages": [[{"role": "assistant", "content": "<think>x</think><answer>a</answer>"}] for _ in rows],
        "answer": [r.get("answer") for r in rows],
        "format_ok": [r.get("ok", True) for r in rows],
        "n_turns": [r["n"] for r in rows],
        "loss_mask": [[1, 1, 0] * r["n"] for r in rows],   # n runs of sampled tokens: the turns grpo-step sees
        "turn_ig": [r.get("turns") for r in rows],
        "ig": [sum(r["turns"]) if r.get("turns") is not None else None for r in rows],
        "ig_error": [None if r.get("turns") is not None else "scoring failed" for r in rows],
    }
    return pa.table({k: schema.array(k, v) for k, v in cols.items()})


# One group at T=2 of 10 (alpha 0.4), gamma 1:
#   outcome O = [1, 0, -1, 1] (row 2 ill formed)  -> mean 0.25, population std sqrt(0.6875) = 0.829156
#   A_hat = [0.904534, -0.301511, -1.507557, 0.904534]
#   pooled turn gains of the usable rows 0 and 1: [0.1, 0.3, 0.2] -> mean 0.2, std 0.0816497
#   normalized: row 0 [-1.224745, 1.224745], row 1 [0]
#   row 0: t=1: 0.4*1.224745 + 0.6*0.904534 = 1.032618 ; t=0: 0.4*(-1.224745 + 1.224745) + 0.6*0.904534 = 0.542720
#   row 1: 0.4*0 + 0.6*(-0.301511) = -0.180907
#   row 2 (ill formed) and row 3 (score-ig failed): the outcome advantage on every turn
GROUP = [
    {"group": "g", "answer": "Paris", "n": 2, "turns": [0.1, 0.3]},
    {"group": "g", "answer": "Lyon", "n": 1, "turns": [0.2]},
    {"group": "g", "answer": "Paris", "n": 3, "turns": [0.5, 0.5, 0.5], "ok": False},
    {"group": "g", "answer": "Paris", "n": 2, "turns": None},
]
WANT = [[0.542720, 1.032618], [-0.180907], [-1.507557] * 3, [0.904534] * 2]


def cfg(**kw):
    return agg.AggregateConfig(**{"step": 2, "total_steps": 10, "process": "ig", "credit": "turn", **kw})


def turn_adv(rows, **kw):
    return agg.run(ig_table(rows), cfg(**kw), CTX).column("turn_advantages").to_pylist()


def test_turn_advantages_on_a_hand_computed_group():
    out = agg.run(ig_table(GROUP), cfg(), CTX).to_pylist()
    for got, want in zip([r["turn_advantages"] for r in out], WANT):
        assert got == pytest.approx(want, abs=1e-5)
    # the trajectory-level columns are GRPO's, with ig fused: 0.4*ig + 0.6*f1, -1 ill formed, f1 on failure
    assert [r["reward"] for r in out] == pytest.approx([0.4 * 0.4 + 0.6, 0.4 * 0.2, -1.0, 1.0])


def test_gamma_discounts_later_turns_and_the_outcome():
    got = turn_adv(GROUP, gamma=0.5)[0]
    # t=1 as with gamma 1; t=0: 0.4*(-1.224745 + 0.5*1.224745) + 0.6*0.5*0.904534
    assert got == pytest.approx([0.4 * -0.612372 + 0.3 * 0.904534, 1.032618], abs=1e-5)


def test_one_turn_episodes():
    rows = [{"group": "g", "answer": "Paris", "n": 1, "turns": [0.1]},
            {"group": "g", "answer": "Rome", "n": 1, "turns": [0.3]}]
    # outcome advantages [1, -1]; pooled gains [0.1, 0.3] -> [-1, 1]
    assert turn_adv(rows) == [pytest.approx([0.4 * -1 + 0.6 * 1], abs=1e-4),
                              pytest.approx([0.4 * 1 - 0.6 * 1], abs=1e-4)]


def test_groups_of_one():
    rows = [{"group": "a", "answer": "Paris", "n": 1, "turns": [0.4]},
            {"group": "b", "answer": "Paris", "n": 2, "turns": [0.1, 0.3]},
            {"group": "c", "answer": "Paris", "n": 2, "turns": [0.2, 0.2], "ok": False}]
    a, b, c = turn_adv(rows)
    assert a == [0.0]                                           # nothing to compare with
    assert b == pytest.approx([0.0, 0.4], abs=1e-4)            # its own turns still rank: [-1, 1] pooled
    assert c == [0.0, 0.0]                                      # ill formed, alone: outcome advantage 0


def test_ill_formed_turns_get_the_outcome_advantage_and_stay_out_of_the_pool():
    base = turn_adv(GROUP[:2] + [GROUP[3]])
    with_bad = turn_adv(GROUP)
    # the ill-formed row's huge gains do not move the others' normalized turn rewards
    outcome = agg.advantages([1.0, 0.0, -1.0, 1.0], ["g"] * 4)
    assert with_bad[2] == pytest.approx([outcome[2]] * 3)
    assert [x - 0.6 * outcome[0] for x in with_bad[0]] == pytest.approx(
        [x - 0.6 * agg.advantages([1.0, 0.0, 1.0], ["g"] * 3)[0] for x in base[0]], abs=1e-5)


def test_outcome_only_turn_credit_is_the_trajectory_advantage():
    rows = [{"group": "g", "answer": a, "n": n, "turns": [0.0] * n} for a, n in (("Paris", 2), ("Rome", 3))]
    out = agg.run(ig_table(rows), cfg(process="none"), CTX).to_pylist()
    assert [r["turn_advantages"] for r in out] == [[r["advantage"]] * r["n_turns"] for r in out]
    # and the default stays trajectory-level: no turn column at all
    assert "turn_advantages" not in agg.run(ig_table(rows), cfg(credit="trajectory"), CTX).column_names


def test_atr_turn_rewards_are_each_turns_thought_scores():
    t = ig_table([{"group": "g", "answer": "Paris", "n": 2, "turns": [0, 0]},
                  {"group": "g", "answer": "Paris", "n": 2, "turns": [0, 0]}])
    thoughts = [[{"turn": 0, "tag": "PLAN", "text": "x", "score": 2.0}, {"turn": 0, "tag": "ACTION", "text": "y",
                 "score": 4.0}, {"turn": 1, "tag": "OBSERVATION", "text": "z", "score": 9.0}],
                [{"turn": 1, "tag": "PLAN", "text": "x", "score": 5.0}]]   # no thought in turn 0: reward 0
    t = schema.set_columns(t, {"atomic_thoughts": thoughts, "atr": [0.5, 0.5], "rrm_error": [None, None]})
    out = agg.run(t, cfg(process="atr"), CTX).column("turn_advantages").to_pylist()
    pool = [0.3, 0.9, 0.0, 0.5]
    mu = sum(pool) / 4
    sd = math.sqrt(sum((x - mu) ** 2 for x in pool) / 4)
    z = [(x - mu) / sd for x in pool]
    # equal outcomes: the advantages are alpha times the returns of the normalized turn ATRs
    assert out == [pytest.approx([0.4 * (z[0] + z[1]), 0.4 * z[1]], abs=1e-5),
                   pytest.approx([0.4 * (z[2] + z[3]), 0.4 * z[3]], abs=1e-5)]


@pytest.mark.parametrize("bad", [dict(process="rrm"), dict(credit="token"), dict(gamma=1.5)])
def test_bad_choices_are_input_errors(bad):
    with pytest.raises(InputError):
        agg.run(ig_table(GROUP), cfg(**bad), CTX)


def test_old_no_atr_means_process_none_and_inputs_follow_the_process(capsys):
    assert cfgmod.build(agg.AggregateConfig, {"no_atr": True}).process == "none"
    assert "deprecated" in capsys.readouterr().err
    with pytest.raises(InputError, match="contradicts"):
        cfgmod.build(agg.AggregateConfig, {"no_atr": True, "process": "ig"})
    assert "ig" not in agg.input_columns(agg.AggregateConfig())
    assert {"ig", "ig_error"} <= set(agg.input_columns(agg.AggregateConfig(process="ig")))
    assert "turn_ig" in agg.input_columns(agg.AggregateConfig(process="ig", credit="turn"))
    assert not {"atr", "ig"} & set(agg.input_columns(agg.AggregateConfig(process="none", credit="turn")))
    with pytest.raises(InputError, match="atom score-ig"):
        schema.require(ig_table(GROUP).drop(["ig"]), "aggregate-reward",
                       columns=agg.input_columns(agg.AggregateConfig(process="ig")))


def test_turn_ig_that_disagrees_with_the_turns_is_refused():
    rows = [{"group": "g", "answer": "Paris", "n": 3, "turns": [0.1, 0.2]}]
    with pytest.raises(InputError) as e:
        turn_adv(rows)
    assert e.value.row == 0 and e.value.column == "turn_ig"


# --- grpo-step with turn_advantages ------------------------------------------------------------------

@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model)


def _grpo_table(tok, advantages, turn_advantages=None):
    """test_grpo_step's token table (every row: a search turn and an answer turn, two runs of 1s)."""
    t = make_table(tok, n=len(advantages), advantages=advantages)
    return schema.set_columns(t, {"turn_advantages": turn_advantages}) if turn_advantages is not None else t


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _grpo_cfg(model, **kw):
    return grpo_step.GRPOConfig(**{"model": str(model), "lr": 1e-3, "beta": 0.0, "micro_batch": 2,
                                   "gradient_checkpointing": False, **kw})


def test_equal_turn_advantages_are_the_trajectory_level_update(tiny_model, tok):
    adv = [0.9, -0.4, 0.0, 1.2]
    plain = grpo_step.run(_grpo_table(tok, adv), _grpo_cfg(tiny_model), CTX)
    turns = grpo_step.run(_grpo_table(tok, adv, [[a, a] for a in adv]), _grpo_cfg(tiny_model), CTX)
    assert turns.metrics["credit"] == "turn" and plain.metrics["credit"] == "trajectory"
    assert turns.metrics["loss"] == plain.metrics["loss"]
    assert turns.metrics["skipped_zero_advantage"] == plain.metrics["skipped_zero_advantage"] == 1
    wa, wb = _weights(plain.model), _weights(turns.model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    split = grpo_step.run(_grpo_table(tok, adv, [[a, -a] for a in adv]), _grpo_cfg(tiny_model), CTX)
    ws = _weights(split.model)
    assert split.metrics["loss"] != plain.metrics["loss"]
    assert max((ws[k] - wa[k]).abs().max().item() for k in wa) > 1e-5


def test_every_sampled_token_gets_its_turns_advantage(tiny_model, tok):
    """At ratio 1 the token-mean policy loss is -sum(A_token) / sampled tokens: counts each turn's tokens."""
    from atomcli.agent.episode import turn_spans
    adv = [0.5, -1.0, 0.25]
    per_turn = [[1.5, -0.5], [0.0, 2.0], None]   # a null row falls back to its `advantage`
    table = _grpo_table(tok, adv, per_turn)
    masks = table.column("loss_mask").to_pylist()
    total, n = 0.0, 0
    for m, a, turns in zip(masks, adv, per_turn):
        for k, (s, e) in enumerate(turn_spans(m)):
            total += (turns[k] if turns is not None else a) * (e - s)
            n += e - s
    res = grpo_step.run(table, _grpo_cfg(tiny_model, old_logprobs="recompute"), CTX)
    assert res.metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert res.metrics["pg_loss"] == pytest.approx(-total / n, rel=1e-5)
    assert res.metrics["turn_credit_rows"] == 2


def test_zero_skip_needs_every_turn_at_zero(tiny_model, tok):
    table = _grpo_table(tok, [0.7, 0.7, 0.0], [[0.0, 0.0], [0.0, 0.3], [0.0, 0.0]])
    res = grpo_step.run(table, _grpo_cfg(tiny_model), CTX)
    assert res.metrics["skipped_zero_advantage"] == 2   # rows 0 and 2; row 1's answer turn trains


def test_turn_advantages_that_do_not_fit_the_turns_are_refused(tiny_model, tok):
    table = _grpo_table(tok, [0.7, 0.1], [[0.1, 0.2], [0.5]])
    with pytest.raises(InputError) as e:
        grpo_step.read_batch(table)
    assert e.value.row == 1 and e.value.column == "turn_advantages"
    bad = _grpo_table(tok, [0.7], [[0.1, float("nan")]])
    with pytest.raises(InputError, match="non-finite"):
        grpo_step.read_batch(bad)


# --- run-all ------------------------------------------------------------------------------------------

def test_run_all_quick_with_information_gain_and_turn_credit(tmp_path):
    config = tmp_path / "ig.toml"
    config.write_text('[aggregate-reward]\nprocess = "ig"\ncredit = "turn"\n')
    out = tmp_path / "run"
    atom("run-all", "--demo", "--quick", "--config", config, "--out", out, check=True, timeout=1200)
    for step in ("0001", "0002"):
        d = out / "steps" / step
        rewarded = tableio.read_table(str(d / "rewarded.parquet"))
        stages = [r["stage"] for r in schema.provenance(rewarded)]
        assert stages[-3:] == ["rollout", "score-ig", "aggregate-reward"]
        ig_rec = schema.provenance(rewarded)[-2]
        # scored with the step's own policy: the checkpoint the rollout sampled from
        assert ig_rec["config"]["model"] == schema.provenance(rewarded)[-3]["model"]
        assert schema.provenance(rewarded)[-1]["config"]["process"] == "ig"
        rows = rewarded.to_pylist()
        assert all(r["ig_error"] is None and len(r["turn_ig"]) == len(r["turn_advantages"]) for r in rows)
        assert "atr" not in rewarded.column_names  # score-rrm did not run
        metrics = json.loads((d / "ckpt" / "metrics.json").read_text())
        assert metrics["credit"] == "turn" and metrics["turn_credit_rows"] == len(rows)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(line["ig"] is not None for line in lines)
