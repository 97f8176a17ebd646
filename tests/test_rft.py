"""`atom rft` (rejection sampling: the right, well-formed, answered trajectories, a bounded number a question) and
run-all's rounds of it (atomcli/stages/run_all/rft_rounds.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import atom

from atomcli.errors import InputError
from atomcli.stages import rft, run_all
from atomcli.stages.run_all import rft_rounds as run_rft


def rows():
    def r(qid, sample, answer, gold="OFF", ok=True, finish="answer", source="sqlite_1hop"):
        return {"id": qid, "traj_id": f"{qid}/{sample}", "golden_answers": [gold], "answer": answer,
                "format_ok": ok, "finish_reason": finish, "data_source": source, "prompt_ids": [1, 2, sample],
                "messages": [{"role": "user", "content": qid}]}
    return [
        r("q1", 0, "ON"),                       # wrong
        r("q1", 1, "off"),                      # right (normalized like the scorer): kept
        r("q1", 2, "OFF"),                      # right, but q1 already has one
        r("q2", 0, "OFF", ok=False),            # right words, ill-formed
        r("q2", 1, "OFF", finish="max_turns"),  # not an answer the policy gave
        r("q3", 0, "version 3.32.0", gold="3.32.0", source="sqlite_2hop"),  # F1 0.67: below the default 1.0
        r("q4", 0, None),                       # no answer
    ]


def run(tmp_path, *extra):
    src, out = tmp_path / "roll.parquet", tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist(rows()), src)
    proc = atom("rft", src, "-o", out, *extra)
    proc.stderr = proc.stderr.decode()
    return proc, out


def test_keeps_one_right_answer_a_question_with_its_token_columns(tmp_path):
    proc, out = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    kept = pq.read_table(out).to_pylist()
    assert [r["traj_id"] for r in kept] == ["q1/1"]
    assert kept[0]["prompt_ids"] == [1, 2, 1]
    assert "kept 1 of 7 trajectories, 1 of 4 questions" in proc.stderr


def test_thresholds_and_per_question_bound_are_options(tmp_path):
    proc, out = run(tmp_path, "--min-f1", "0.5", "--per-question", "2")
    assert proc.returncode == 0, proc.stderr
    assert [r["traj_id"] for r in pq.read_table(out).to_pylist()] == ["q1/1", "q1/2", "q3/0"]


@pytest.mark.parametrize("flags, message", [(["--min-f1", "1.1"], "--min-f1 must be in [0, 1]"),
                                            (["--per-question", "0"], "--per-question must be >= 1")])
def test_bad_settings_are_one_line_errors(tmp_path, flags, message):
    proc, out = run(tmp_path, *flags)
    assert proc.returncode == 2 and message in proc.stderr and not out.exists()


def test_nothing_right_is_refused_and_writes_nothing(tmp_path):
    src, out = tmp_path / "roll.parquet", tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist([r for r in rows() if r["id"] != "q1"]), src)
    proc = atom("rft", src, "-o", out)
    assert proc.returncode == 2 and b"nothing to fine-tune on" in proc.stderr and not out.exists()


def test_a_table_without_answers_names_the_stage_that_makes_them(tmp_path):
    src = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "q1", "question": "?", "golden_answers": ["a"]}]), src)
    proc = atom("rft", src, "-o", tmp_path / "out.parquet")
    assert proc.returncode == 2 and b"column `answer`" in proc.stderr and b"atom rollout" in proc.stderr


# -- run-all's rounds, with a fake policy: the loop's bookkeeping, no model ---------------------------------------

QUESTIONS = [{"id": f"d{i}", "question": f"demo {i}?", "golden_answers": ["x"], "data_source": "demo_1hop"}
             for i in range(3)] + \
            [{"id": f"s{i}", "question": f"real {i}?", "golden_answers": ["x"], "data_source": "sqlite_1hop"}
             for i in range(6)]


class FakeRun:
    """What rounds() uses of run_all.Run. The policy answers question sN right in round r when N < 2 * r
    (a policy that gets better each round), and only its second sample does."""

    def __init__(self, out: Path, rounds: int, exclude=()):
        self.out = out
        self.cfg = run_all.RunAllConfig(rft_rounds=rounds, rft_sources="sqlite", rft_group_size=2, rft_lr=1e-4,
                                        seed=5, train=str(out / "train.jsonl"))
        self.rft = rft.RFTConfig()
        from atomcli.stages.rollout import RolloutConfig
        from atomcli.stages.sft import SFTConfig
        self.rollout = RolloutConfig(group_size=8, seed=5)
        self.sft = SFTConfig(lr=2e-4, sampling="length", max_steps=40, warmup_ratio=0.1, seed=5)
        self.calls: list = []

    def log(self, msg):
        self.calls.append(("log", msg))

    def read(self, path, stage=None):
        return pq.read_table(path)

    def rollout_stage(self, cfg, inp, out):
        if out.exists():  # as run_all.Run: an output that exists is complete (resume)
            return
        qs = pq.read_table(inp).to_pylist()
        r = int(out.parent.name)
        self.calls.append(("rollout", cfg.model, cfg.group_size, cfg.seed, [q["id"] for q in qs]))
        rows = [{**q, "traj_id": f"{q['id']}/{k}/{r}", "answer": "x" if k == 1 and int(q["id"][1:]) < 2 * r else "y",
                 "format_ok": True, "finish_reason": "answer", "messages": [{"role": "user", "content": q["id"]}]}
                for q in qs for k in range(cfg.group_size)]
        pq.write_table(pa.Table.from_pylist(rows), out)

    def table_stage(self, stage, mod, cfg, inp, out):
        if out.exists():
            return
        from atomcli import envelope
        from atomcli.context import Context
        envelope.table_to_table(stage, mod, cfg, str(inp), str(out), Context(quiet=True))

    def train_stage(self, stage, mod, cfg, inp, out):
        if out.exists():
            return
        self.calls.append(("sft", cfg.model, cfg.lr, cfg.epochs, cfg.max_steps, cfg.sampling, cfg.warmup_ratio,
                           pq.read_table(inp).column("traj_id").to_pylist()))
        out.mkdir(parents=True)

    def eval_point(self, name, model):
        self.calls.append(("eval", name, model))

    def evaluate_transfer(self, name, model):
        self.calls.append(("transfer", name, model))


def _train(tmp_path):
    return pa.Table.from_pylist(QUESTIONS)


def test_rounds_sample_the_unsolved_real_questions_and_fine_tune_the_sft_checkpoint_on_every_kept_row(tmp_path):
    train = _train(tmp_path)
    run = FakeRun(tmp_path, rounds=2)
    pool = run_rft.pool(train, run.cfg, exclude={3})  # row 3 (s0) is a dev question
    assert pool == [4, 5, 6, 7, 8]
    last = run_rft.rounds(run, train, pool, "SFT")
    calls = [c for c in run.calls if c[0] != "log"]
    r1 = tmp_path / "rft" / "01" / "ckpt"
    r2 = tmp_path / "rft" / "02" / "ckpt"
    assert last == str(r2)
    assert calls == [
        # round 1: the SFT policy, 2 samples of every real question but the dev one, seed = run seed;
        # one whole epoch (max_steps 0, not the SFT's 40) at rft_lr, the [sft] section's warmup
        ("rollout", "SFT", 2, 5, ["s1", "s2", "s3", "s4", "s5"]),
        ("sft", "SFT", 1e-4, 1.0, 0, "random", 0.1, ["s1/1/1"]),
        ("eval", "rft-01", str(r1)), ("transfer", "rft-01", str(r1)),
        # round 2: round 1's policy on what it left unsolved; the SFT checkpoint tuned on both rounds' rows
        ("rollout", str(r1), 2, 6, ["s2", "s3", "s4", "s5"]),
        ("sft", "SFT", 1e-4, 1.0, 0, "random", 0.1, ["s1/1/1", "s2/1/2", "s3/1/2"]),
        ("eval", "rft-02", str(r2)), ("transfer", "rft-02", str(r2)),
    ]
    # a rerun (resume) redoes nothing and ends at the same checkpoint; a run killed after round 1 redoes round 2
    # only, with `solved` rebuilt from round 1's kept rows
    again = FakeRun(tmp_path, rounds=2)
    assert run_rft.rounds(again, train, pool, "SFT") == str(r2)
    assert [c[0] for c in again.calls if c[0] not in ("log", "eval", "transfer")] == []
    import shutil
    shutil.rmtree(tmp_path / "rft" / "02")
    third = FakeRun(tmp_path, rounds=2)
    assert run_rft.rounds(third, train, pool, "SFT") == str(r2)
    assert [c for c in third.calls if c[0] in ("rollout", "sft")] == [calls[4], calls[5]]


def _with_weights(run):
    """Round r's tune writes a checkpoint whose one tensor is all r (FakeRun's tunes write an empty folder)."""
    import torch
    from safetensors.torch import save_file
    plain = run.train_stage

    def train_stage(stage, mod, cfg, inp, out):
        if out.exists():
            return
        plain(stage, mod, cfg, inp, out)
        save_file({"w": torch.full((2, 3), float(out.parent.name))}, str(out / "model.safetensors"))
        (out / "config.json").write_text('{"model_type": "llama"}')
    run.train_stage = train_stage
    return run


def test_rft_soup_averages_the_rounds_checkpoints_and_hands_the_average_on(tmp_path):
    import json

    import torch
    from safetensors.torch import load_file
    run = _with_weights(FakeRun(tmp_path, rounds=2))
    run.cfg = dataclasses.replace(run.cfg, rft_soup=True)
    last = run_rft.rounds(run, _train(tmp_path), [3, 4, 5, 6, 7, 8], "SFT")
    soup = tmp_path / "rft" / "soup" / "ckpt"
    assert last == str(soup)
    assert torch.equal(load_file(str(soup / "model.safetensors"))["w"], torch.full((2, 3), 1.5))
    assert json.loads((soup / "config.json").read_text()) == {"model_type": "llama"}
    state = json.loads((soup / "atom_state.json").read_text())
    assert state["stage"] == "soup" and [Path(p).parent.name for p in state["soup"]] == ["01", "02"]
    evals = [c for c in run.calls if c[0] in ("eval", "transfer")]
    assert evals[-2:] == [("eval", "rft-soup", str(soup)), ("transfer", "rft-soup", str(soup))]
    # resumed: the soup is there and is not remade, and the rounds still hand it on
    made = (soup / "model.safetensors").stat().st_mtime_ns
    again = _with_weights(FakeRun(tmp_path, rounds=2))
    again.cfg = run.cfg
    assert run_rft.rounds(again, _train(tmp_path), [3, 4, 5, 6, 7, 8], "SFT") == str(soup)
    assert (soup / "model.safetensors").stat().st_mtime_ns == made
    assert not any(c[0] == "log" and "soup of" in c[1] for c in again.calls)


def test_rft_soup_with_one_round_goes_on_from_that_round(tmp_path):
    run = _with_weights(FakeRun(tmp_path, rounds=1))
    run.cfg = dataclasses.replace(run.cfg, rft_soup=True)
    assert run_rft.rounds(run, _train(tmp_path), [3, 4, 5, 6, 7, 8], "SFT") == str(tmp_path / "rft" / "01" / "ckpt")
    assert not (tmp_path / "rft" / "soup").exists()
    assert any(c[0] == "log" and "nothing to average" in c[1] for c in run.calls)


@pytest.mark.parametrize("soup_on, point", [(True, "rft-soup"), (False, "rft-02")])
def test_without_round_evals_only_the_rounds_result_is_evaluated(tmp_path, soup_on, point):
    run = _with_weights(FakeRun(tmp_path, rounds=2))
    run.cfg = dataclasses.replace(run.cfg, rft_soup=soup_on, rft_eval_rounds=False)
    last = run_rft.rounds(run, _train(tmp_path), [3, 4, 5, 6, 7, 8], "SFT")
    assert last == str(tmp_path / "rft" / ("soup" if soup_on else "02") / "ckpt")
    assert [c for c in run.calls if c[0] in ("eval", "transfer")] == [("eval", point, last),
                                                                       ("transfer", point, last)]
    assert [c[0] for c in run.calls if c[0] in ("rollout", "sft")] == ["rollout", "sft"] * 2


def test_a_soup_refuses_ingredients_that_cannot_be_averaged(tmp_path):
    import torch
    from safetensors.torch import save_file

    from atomcli.train import soup
    for name, shape, config in (("a", (2,), "{}"), ("b", (2,), "{}"), ("c", (2,), '{"other": 1}'), ("d", (3,), "{}")):
        (tmp_path / name).mkdir()
        save_file({"w": torch.zeros(shape)}, str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text(config)
    (tmp_path / "adapter").mkdir()
    out = str(tmp_path / "out")
    for ckpts, message in (([tmp_path / "a"], "at least two checkpoints, got 1"),
                           ([tmp_path / "a", tmp_path / "adapter"], "no model.safetensors"),
                           ([tmp_path / "a", tmp_path / "c"], "config.json differs"),
                           ([tmp_path / "a", tmp_path / "d"], "other tensors")):
        with pytest.raises(InputError, match=message):
            soup.average([str(c) for c in ckpts], out)
        assert not (tmp_path / "out").exists()  # no partial output
    soup.average([str(tmp_path / "a"), str(tmp_path / "b")], out)
    assert (tmp_path / "out" / "model.safetensors").is_file() and not (tmp_path / "out.tmp").exists()


def test_with_a_dev_split_the_rounds_leave_transfer_to_the_final_checkpoint(tmp_path):
    run = FakeRun(tmp_path, rounds=1)
    run.cfg.dev_questions = 1
    run_rft.rounds(run, _train(tmp_path), [4, 5], "SFT")
    assert [c[:2] for c in run.calls if c[0] in ("eval", "transfer")] == [("eval", "rft-01")]


def test_rounds_stop_when_every_question_is_solved(tmp_path):
    train = _train(tmp_path)
    run = FakeRun(tmp_path, rounds=3)
    last = run_rft.rounds(run, train, [4, 5], "SFT")  # s1 (round 1) and s2 (round 2): nothing left for round 3
    assert last == str(tmp_path / "rft" / "02" / "ckpt") and not (tmp_path / "rft" / "03").exists()
    assert any(c[0] == "log" and "every question is solved" in c[1] for c in run.calls)


def test_a_round_that_keeps_nothing_after_one_that_did_returns_the_last_tuned_checkpoint(tmp_path):
    train = pa.Table.from_pylist([q for q in QUESTIONS if q["id"] in ("s1", "s4", "s5")])
    run = FakeRun(tmp_path, rounds=2)  # round 1 solves s1; s4, s5 need round 3
    assert run_rft.rounds(run, train, [0, 1, 2], "SFT") == str(tmp_path / "rft" / "01" / "ckpt")
    assert any(c[0] == "log" and "rft round 2" in c[1] and "no more rounds" in c[1] for c in run.calls)


def test_a_round_that_keeps_nothing_ends_the_rounds_without_failing_the_run(tmp_path):
    train = pa.Table.from_pylist([q for q in QUESTIONS if q["id"] in ("d0", "s4", "s5")])
    run = FakeRun(tmp_path, rounds=3)  # s4, s5 are right only from round 3 on
    last = run_rft.rounds(run, train, run_rft.pool(train, run.cfg, set()), "SFT")
    assert last == "SFT" and not (tmp_path / "rft" / "01" / "ckpt").exists()
    assert any(c[0] == "log" and "nothing to fine-tune on" in c[1] and "no more rounds" in c[1] for c in run.calls)
    assert [c[0] for c in run.calls if c[0] != "log"] == ["rollout"]


def test_sources_that_match_no_question_are_refused_before_anything_runs(tmp_path):
    cfg = dataclasses.replace(FakeRun(tmp_path, 1).cfg, rft_sources="hotpot")
    with pytest.raises(InputError, match="matches no training question") as e:
        run_rft.pool(_train(tmp_path), cfg, set())
    assert "demo_1hop" in str(e.value) and "sqlite_1hop" in str(e.value)


@pytest.mark.parametrize("extra, message", [({"rft_rounds": -1}, "rft_rounds must be >= 0, got -1"),
                                            ({"rft_group_size": 0}, "rft_group_size must be >= 1, got 0"),
                                            ({"rft_lr": 0.0}, "rft_lr must be > 0, got 0.0"),
                                            ({"rft_lr": float("nan")}, "rft_lr must be > 0, got nan"),
                                            ({"rft_replay": 1.0}, "`rft_replay` was removed")])
def test_bad_round_settings_are_refused_when_the_run_is_built(tmp_path, extra, message):
    from atomcli.context import Context
    cfg = tmp_path / "c.toml"
    cfg.write_text(run_all.to_toml({"run-all": extra}))
    settings = run_all.prepare(tmp_path / "run", "quick", str(cfg), Context(quiet=True), build=False)
    with pytest.raises(InputError, match=re.escape(message)):
        run_all.Run(tmp_path / "run", settings, Context(quiet=True))


def test_a_lora_served_policy_cannot_follow_the_rounds_full_weight_checkpoints(tmp_path):
    """lora-vllm serves adapters: each round writes a full-weight SFT checkpoint, refused at start like sft_data."""
    from atomcli.context import Context
    cfg = tmp_path / "c.toml"
    served = {"model": "openai:http://127.0.0.1:9/v1#m", "policy_sync": "lora-vllm", "sft_data": ""}
    for rounds, refused in ((0, False), (1, True)):
        cfg.write_text(run_all.to_toml({"run-all": {**served, "rft_rounds": rounds}, "grpo-step": {"lora": True}}))
        settings = run_all.prepare(tmp_path / "run", "quick", str(cfg), Context(quiet=True), build=False)
        if refused:
            with pytest.raises(InputError, match="cannot serve an SFT checkpoint"):
                run_all.Run(tmp_path / "run", settings, Context(quiet=True))
        else:
            assert run_all.Run(tmp_path / "run", settings, Context(quiet=True)).follow is not None


def test_a_quick_run_with_rounds_never_samples_a_dev_question_and_finishes(tmp_path):
    """run_all.main's wiring: the pool leaves the dev split out, and a round whose samples are all wrong (the tiny
    random model answers nothing right) ends the rounds with a log line; the GRPO steps and evals still run."""
    cfg = tmp_path / "rft.toml"
    cfg.write_text("[run-all]\nsteps = 1\neval_base = false\ndev_questions = 2\nrft_rounds = 2\nrft_group_size = 1\n")
    out = tmp_path / "run"
    proc = atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, check=True, timeout=900)
    dev = set(pq.read_table(out / "eval" / run_all.DEV / "questions.parquet").column("id").to_pylist())
    sampled = pq.read_table(out / "rft" / "01" / "questions.parquet").column("id").to_pylist()
    train = [r["id"] for r in map(__import__("json").loads, (out / "world" / "train.jsonl").read_text().splitlines())]
    assert len(dev) == 2 and sorted(sampled) == sorted(set(train) - dev)
    assert pq.read_table(out / "rft" / "01" / "rollouts.parquet").num_rows == len(sampled)
    assert b"rft round 1" in proc.stderr and b"no more rounds" in proc.stderr
    assert not (out / "rft" / "02").exists() and (out / "steps" / "0001" / "ckpt" / "config.json").exists()
    assert (out / "summary.md").exists()


def test_a_soup_of_two_saved_models_loads_and_holds_their_mean(tiny_model, tmp_path):
    """The soup of two real checkpoints (the tiny model and a perturbed copy) is a checkpoint atomcli loads, with
    every weight the mean of the two and the tokenizer of the first."""
    import shutil

    import torch

    from atomcli import models
    from atomcli.train import soup
    other = tmp_path / "other"
    model, tok = models.load(str(tiny_model))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.save_pretrained(str(other))
    for f in ("tokenizer.json", "config.json"):
        shutil.copy2(tiny_model / f, other / f)
    soup.average([str(tiny_model), str(other)], str(tmp_path / "soup"))
    mixed, mixed_tok = models.load(str(tmp_path / "soup"))
    base = models.load(str(tiny_model))[0].state_dict()
    assert mixed_tok.get_vocab() == tok.get_vocab()
    assert all(torch.allclose(v, base[k] + 0.5, atol=1e-6) for k, v in mixed.state_dict().items())
