"""aggregate-reward: the reward formula on hand-computed rows, schedules, advantages, the CLI."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import atom

from atomcli import schema
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages.aggregate_reward import AggregateConfig, advantages, alpha, run

CTX = Context(quiet=True)


def table(rows: list[dict], *, with_atr: bool = True) -> pa.Table:
    cols = {
        "golden_answers": [r.get("golden", ["Paris"]) for r in rows],
        "group_id": [r["group"] for r in rows],
        "messages": [[{"role": "assistant", "content": "<think>x</think><answer>a</answer>"}] for _ in rows],
        "answer": [r.get("answer") for r in rows],
        "format_ok": [r.get("ok", True) for r in rows],
        "finish_reason": [r.get("finish", "answer" if r.get("ok", True) else "error") for r in rows],
    }
    if with_atr:
        cols["atr"] = [r.get("atr") for r in rows]
        cols["rrm_error"] = [r.get("err") for r in rows]
    cols["note"] = [f"row {i}" for i in range(len(rows))]
    return pa.table({k: schema.array(k, v) for k, v in cols.items()})


# group g1 at T=2 of 10, linear: alpha = 0.5 * (1 - 2/10) = 0.4
G1 = [
    {"group": "g1", "answer": "Paris", "atr": 0.8},                       # f1 1 -> 0.4*0.8 + 0.6*1 = 0.92
    {"group": "g1", "answer": "Lyon", "atr": 0.5},                        # f1 0 -> 0.4*0.5 = 0.2
    {"group": "g1", "answer": "Paris", "atr": 0.9, "ok": False},          # ill formed -> -1
    {"group": "g1", "answer": "Paris, France", "atr": None, "err": "HTTP 500"},  # judge failed -> f1 = 2/3
]
# population std of [0.92, 0.2, -1, 2/3] around 0.196667: sqrt(2.176133 / 4) = 0.737586
G1_REWARD = [0.92, 0.2, -1.0, 2 / 3]
G1_ADV = [0.723333 / 0.737587, 0.003333 / 0.737587, -1.196667 / 0.737587, 0.47 / 0.737587]


def test_reward_and_advantage_on_hand_computed_rows():
    out = run(table(G1), AggregateConfig(step=2, total_steps=10), CTX).to_pylist()
    assert [r["alpha"] for r in out] == pytest.approx([0.4] * 4)
    assert [r["f1"] for r in out] == pytest.approx([1.0, 0.0, 1.0, 2 / 3])
    assert [r["em"] for r in out] == [1.0, 0.0, 1.0, 0.0]
    assert [r["format_penalty"] for r in out] == [0.0, 0.0, -1.0, 0.0]
    assert [r["reward"] for r in out] == pytest.approx(G1_REWARD)
    assert [r["advantage"] for r in out] == pytest.approx(G1_ADV, rel=1e-4)


def test_reward_literals_at_three_steps():
    rows = [{"group": "g", "answer": "Paris Texas", "atr": 0.8}, {"group": "g", "answer": "Rome", "atr": 0.5}]
    got = [[r["reward"] for r in run(table(rows), AggregateConfig(step=t, total_steps=10), CTX).to_pylist()]
           for t in (0, 5, 10)]
    # T=0: .5*.8 + .5*2/3 = 0.733333, .5*.5 = 0.25 ; T=5: .25*.8 + .75*2/3 = 0.7, .125 ; T=10: 2/3, 0
    assert got == [pytest.approx([0.733333, 0.25], rel=1e-5), pytest.approx([0.7, 0.125], rel=1e-5),
                   pytest.approx([0.666667, 0.0], rel=1e-5)]


@pytest.mark.parametrize("schedule, step, want", [
    ("linear", 0, 0.5), ("linear", 5, 0.25), ("linear", 10, 0.0),
    ("cosine", 0, 0.5), ("cosine", 5, 0.25), ("cosine", 10, 0.0), ("cosine", 2, 0.25 * (1 + math.cos(math.pi / 5))),
    ("constant", 7, 0.5), ("none", 0, 0.0),
])
def test_schedules(schedule, step, want):
    assert alpha(AggregateConfig(step=step, total_steps=10, schedule=schedule)) == pytest.approx(want)


def test_cosine_literal():
    # 0.5 * 0.5 * (1 + cos(pi * 0.25)) = 0.25 * 1.7071068
    assert alpha(AggregateConfig(step=1, total_steps=4, schedule="cosine")) == pytest.approx(0.4267767)


def test_alpha0_scales_every_schedule():
    assert alpha(AggregateConfig(step=5, total_steps=10, alpha0=0.8)) == pytest.approx(0.4)
    assert alpha(AggregateConfig(step=3, total_steps=10, alpha0=0.3, schedule="constant")) == pytest.approx(0.3)


def test_zero_variance_group_and_group_of_one_get_zero_advantage():
    rows = [{"group": "flat", "answer": "Rome", "atr": 0.5}, {"group": "flat", "answer": "Rome", "atr": 0.5},
            {"group": "alone", "answer": "Paris", "atr": 1.0}]
    out = run(table(rows), AggregateConfig(step=0, total_steps=10), CTX).to_pylist()
    assert [r["reward"] for r in out] == pytest.approx([0.25, 0.25, 1.0])
    assert [r["advantage"] for r in out] == [0.0, 0.0, 0.0]


def test_flat_outcome_skip_zeroes_only_groups_whose_outcomes_tie():
    rows = [{"group": "fail", "answer": "Rome", "atr": 0.9}, {"group": "fail", "answer": "Lyon", "atr": 0.1},
            {"group": "bad", "answer": "Rome", "atr": 0.9, "ok": False},
            {"group": "bad", "answer": "Rome", "atr": 0.1, "ok": False},
            {"group": "mixed", "answer": "Paris", "atr": 0.2}, {"group": "mixed", "answer": "Rome", "atr": 0.9}]
    fused = run(table(rows), AggregateConfig(step=0, total_steps=10), CTX).to_pylist()
    skip = run(table(rows), AggregateConfig(step=0, total_steps=10, flat_outcome="skip"), CTX).to_pylist()
    # by default ATR alone ranks the all-F1-0 group; with skip it gets no signal, and the ill-formed
    # group (outcome -1 twice) has none either way; rewards are unchanged
    assert [r["advantage"] for r in fused[:2]] == pytest.approx([1.0, -1.0], abs=1e-5)
    assert [r["advantage"] for r in skip[:4]] == [0.0, 0.0, 0.0, 0.0]
    assert [r["reward"] for r in skip] == [r["reward"] for r in fused]
    # a group whose outcomes differ keeps the fused advantage: 0.5*0.2+0.5*1 = 0.6 vs 0.45 -> +-1
    assert [r["advantage"] for r in skip[4:]] == pytest.approx([1.0, -1.0], abs=1e-4)
    assert [r["advantage"] for r in skip[4:]] == [r["advantage"] for r in fused[4:]]


def test_flat_outcome_skip_zeroes_turn_advantages_too():
    rows = [{"group": "fail", "answer": "Rome", "atr": 0.9}, {"group": "fail", "answer": "Lyon", "atr": 0.1}]
    t = table(rows).append_column("atomic_thoughts", pa.array(
        [[{"turn": 0, "score": 9.0}], [{"turn": 0, "score": 1.0}]]))
    cfg = dict(step=0, total_steps=10, credit="turn")
    assert run(t, AggregateConfig(**cfg), CTX).column("turn_advantages").to_pylist()[0][0] > 0
    got = run(t, AggregateConfig(**cfg, flat_outcome="skip"), CTX).column("turn_advantages").to_pylist()
    assert got == [[0.0], [0.0]]


def test_equal_rewards_give_exactly_zero_advantage_despite_rounding():
    # mean(0.1, 0.1, 0.1) = 0.10000000000000002: without the tie rule (r - mean)/1e-6 = -1.4e-11,
    # which grpo-step would not skip
    assert advantages([0.1, 0.1, 0.1], ["g", "g", "g"]) == [0.0, 0.0, 0.0]


def test_std_is_the_population_std():
    # rewards [0, 1]: population std 0.5 -> advantages -1, 1 (torch.std's unbiased 0.707 would give +-0.707)
    assert advantages([0.0, 1.0], ["g", "g"]) == pytest.approx([-1.0, 1.0], rel=1e-5)


def test_no_std_is_dr_grpo():
    out = run(table(G1), AggregateConfig(step=2, total_steps=10, no_std=True), CTX).to_pylist()
    assert [r["advantage"] for r in out] == pytest.approx([0.723333, 0.003333, -1.196667, 0.47], abs=1e-5)


def test_groups_are_independent_of_row_order():
    rows = [{"group": "a", "answer": "Paris", "atr": 0.0}, {"group": "b", "answer": "Rome", "atr": 1.0},
            {"group": "a", "answer": "Rome", "atr": 0.0}, {"group": "b", "answer": "Rome", "atr": 0.0}]
    out = run(table(rows), AggregateConfig(step=10, total_steps=10), CTX).to_pylist()
    # a: rewards f1 [1, 0] -> +-1 ; b: [0, 0] (alpha 0 at the end) -> 0
    assert [r["advantage"] for r in out] == pytest.approx([1.0, 0.0, -1.0, 0.0], abs=1e-5)


def test_process_none_is_pure_outcome_and_needs_no_score_columns():
    t = table(G1, with_atr=False)
    out = run(t, AggregateConfig(step=2, total_steps=10, process="none"), CTX).to_pylist()
    assert [r["reward"] for r in out] == pytest.approx([1.0, 0.0, -1.0, 2 / 3])
    assert {r["alpha"] for r in out} == {0.0}


def test_set_f1_variant():
    rows = [{"group": "g", "answer": "the the Paris", "atr": 0.0, "golden": ["Paris"]}]
    token = run(table(rows), AggregateConfig(step=10, total_steps=10), CTX).column("f1")[0].as_py()
    sets = run(table(rows), AggregateConfig(step=10, total_steps=10, f1="set"), CTX).column("f1")[0].as_py()
    assert token == 1.0  # articles dropped
    assert sets == pytest.approx(2 / 3)  # {the, paris} vs {paris}


def test_other_columns_pass_through_and_rerun_replaces_in_place():
    t = table(G1)
    once = run(t, AggregateConfig(step=2, total_steps=10), CTX)
    twice = run(once, AggregateConfig(step=2, total_steps=10), CTX)
    assert once.column_names[:t.num_columns] == t.column_names
    for name in t.column_names:
        assert once.column(name).equals(t.column(name))
    assert twice.column_names == once.column_names and twice.equals(once)


# one question's group: a right and a wrong answer, a sample cut by the turn cap, one by the context cap,
# and one that answered with broken tags (ill formed, not truncated)
TRUNC = [{"group": "g", "answer": "Paris"}, {"group": "g", "answer": "Rome"},
         {"group": "g", "answer": None, "ok": False, "finish": "max_turns"},
         {"group": "g", "answer": None, "ok": False, "finish": "length"},
         {"group": "g", "answer": "Paris", "ok": False, "finish": "answer"}]


def test_truncated_penalty_ranks_cut_samples_below_every_answer():
    out = run(table(TRUNC), AggregateConfig(step=10, total_steps=10), CTX).to_pylist()
    assert [r["reward"] for r in out] == [1.0, 0.0, -1.0, -1.0, -1.0]
    # mean -0.4, population std sqrt((1.96 + 0.16 + 3 * 0.36) / 5) = 0.8
    assert [r["advantage"] for r in out] == pytest.approx([1.75, 0.5, -0.75, -0.75, -0.75], rel=1e-5)


def test_truncated_mask_zeroes_cut_samples_and_leaves_them_out_of_the_group():
    out = run(table(TRUNC), AggregateConfig(step=10, total_steps=10, truncated="mask"), CTX).to_pylist()
    # rewards follow the contract either way (a truncated sample has no answer: -1)
    assert [r["reward"] for r in out] == [1.0, 0.0, -1.0, -1.0, -1.0]
    assert [r["format_penalty"] for r in out] == [0.0, 0.0, -1.0, -1.0, -1.0]
    # the group is the other three: rewards 1, 0, -1 -> mean 0, population std sqrt(2/3)
    sd = math.sqrt(2 / 3)
    assert [r["advantage"] for r in out] == pytest.approx([1 / sd, 0.0, 0.0, 0.0, -1 / sd], rel=1e-5)
    assert out[2]["advantage"] == 0.0 and out[3]["advantage"] == 0.0


def test_truncated_fail_ranks_cut_samples_as_wrong_answers():
    out = run(table(TRUNC), AggregateConfig(step=10, total_steps=10, truncated="fail"), CTX).to_pylist()
    assert [r["reward"] for r in out] == [1.0, 0.0, -1.0, -1.0, -1.0]  # the contract's reward, unchanged
    # ranked on 1, 0, 0, 0, -1 (the bad-tag answer keeps -1): mean 0, population std sqrt(2/5)
    sd = math.sqrt(2 / 5)
    assert [r["advantage"] for r in out] == pytest.approx([1 / sd, 0.0, 0.0, 0.0, -1 / sd], rel=1e-5)


def test_truncated_fail_gives_cut_samples_their_process_reward_like_a_wrong_answer():
    rows = [{"group": "g", "answer": "Rome", "atr": 0.2},
            {"group": "g", "answer": None, "atr": 0.6, "ok": False, "finish": "max_turns"}]
    out = run(table(rows), AggregateConfig(step=0, total_steps=10, truncated="fail"), CTX).to_pylist()
    # alpha 0.5: ranked on 0.1 (wrong answer) vs 0.3 (cut, ATR 0.6) -> the cut sample ranks higher
    assert [r["advantage"] for r in out] == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert out[1]["reward"] == -1.0


def test_truncated_mask_zeroes_turn_advantages_of_cut_samples():
    rows = [{"group": "g", "answer": "Paris", "atr": 0.9}, {"group": "g", "answer": "Rome", "atr": 0.1},
            {"group": "g", "answer": None, "atr": 0.5, "ok": False, "finish": "max_turns"}]
    t = table(rows).append_column("atomic_thoughts", pa.array(
        [[{"turn": 0, "score": 9.0}], [{"turn": 0, "score": 1.0}], [{"turn": 0, "score": 5.0}]]))
    cfg = dict(step=0, total_steps=10, credit="turn")
    assert run(t, AggregateConfig(**cfg), CTX).column("turn_advantages").to_pylist()[2][0] < 0
    got = run(t, AggregateConfig(**cfg, truncated="mask"), CTX).column("turn_advantages").to_pylist()
    assert got[2] == [0.0] and got[0][0] > 0 > got[1][0]


def test_truncated_mask_needs_finish_reason():
    for choice in ("mask", "fail"):
        with pytest.raises(InputError, match="finish_reason"):
            run(table(TRUNC).drop_columns(["finish_reason"]), AggregateConfig(truncated=choice), CTX)
    # the default reads no finish_reason
    run(table(TRUNC).drop_columns(["finish_reason"]), AggregateConfig(step=0, total_steps=1), CTX)


@pytest.mark.parametrize("cfg", [
    AggregateConfig(step=-1, total_steps=10), AggregateConfig(step=0, total_steps=0),
    AggregateConfig(step=11, total_steps=10), AggregateConfig(schedule="exp"),
    AggregateConfig(alpha0=1.5), AggregateConfig(alpha0=float("nan")), AggregateConfig(f1="bag"),
    AggregateConfig(flat_outcome="drop"), AggregateConfig(truncated="drop"),
])
def test_bad_options_are_input_errors(cfg):
    with pytest.raises(InputError):
        run(table(G1), cfg, CTX)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1.5, -0.1])
def test_bad_atr_is_an_input_error_naming_the_row(bad):
    rows = [dict(G1[0]), {**G1[1], "atr": bad}]
    with pytest.raises(InputError) as e:
        run(table(rows), AggregateConfig(step=0, total_steps=10), CTX)
    assert e.value.row == 1 and e.value.column == "atr"


# --- command line ------------------------------------------------------------------------------------

def test_cli_missing_column_exits_2_naming_the_stage():
    proc = atom("aggregate-reward", "-", "--out", "-", "--step", "0", "--total-steps", "10",
                input='{"id":"q1","question":"x","golden_answers":["y"]}\n')
    assert proc.returncode == 2
    assert proc.stdout == b""
    err = proc.stderr.decode()
    assert "`group_id`" in err and "atom rollout" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_missing_atr_names_score_rrm_unless_process_none(tmp_path):
    src = tmp_path / "rollouts.parquet"
    pq.write_table(table(G1, with_atr=False), src)
    proc = atom("aggregate-reward", src, "--out", "-", "--step", "0", "--total-steps", "10")
    assert proc.returncode == 2 and proc.stdout == b"" and b"atom score-rrm" in proc.stderr
    proc = atom("aggregate-reward", src, "--out", "-", "--format", "jsonl", "--step", "0", "--total-steps", "10",
                "--process", "none", check=True)
    assert [json.loads(line)["reward"] for line in proc.stdout.splitlines()] == pytest.approx([1, 0, -1, 2 / 3])
    # the old spelling still works this release, with a deprecation line
    old = atom("aggregate-reward", src, "--out", "-", "--format", "jsonl", "--step", "0", "--total-steps", "10",
               "--no-atr", check=True)
    assert old.stdout == proc.stdout and b"--no-atr is deprecated" in old.stderr and b"--process none" in old.stderr


def test_cli_end_to_end_with_summary(tmp_path):
    src, dst = tmp_path / "scored.parquet", tmp_path / "rewarded.parquet"
    pq.write_table(table(G1 + [{"group": "solo", "answer": "Paris", "atr": 1.0}]), src)
    proc = atom("aggregate-reward", src, "--out", dst, "--step", "2", "--total-steps", "10", check=True)
    out = pq.read_table(dst)
    assert out.column("reward").to_pylist()[:4] == pytest.approx(G1_REWARD)
    assert schema.provenance(out)[-1]["stage"] == "aggregate-reward"
    err = proc.stderr.decode()
    assert "0.4000" in err                     # alpha
    assert "1 (20.0%)" in err                  # format errors
    assert "judge fallbacks" in err and "size 1" in err


def test_cli_step_past_total_is_one_line_exit_2(tmp_path):
    src = tmp_path / "scored.parquet"
    pq.write_table(table(G1), src)
    proc = atom("aggregate-reward", src, "--out", tmp_path / "x.parquet", "--step", "11", "--total-steps", "10")
    assert proc.returncode == 2 and b"--step" in proc.stderr
    assert not (tmp_path / "x.parquet").exists()
