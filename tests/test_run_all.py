"""run-all: the quick preset end to end, equality with the piped chain, kill -9 + --resume, presets, planning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, atom

from atomcli import tableio
from atomcli.errors import InputError
from atomcli.stages import run_all
from atomcli.stages.run_all import folder, loop
from atomcli.stages.run_all import step_metrics as sm

TABLES = ["questions", "rollouts", "scored", "rewarded"]


def _rows(path: Path, run_dir: Path | None = None) -> list[dict]:
    """Table rows without wall-clock times (tool_calls[].seconds), the one legitimately varying value,
    and with the run folder's own path (in `policy`) written as RUN."""
    rows = tableio.read_table(str(path)).to_pylist()
    for r in rows:
        if run_dir is not None and isinstance(r.get("policy"), str):
            r["policy"] = r["policy"].replace(str(run_dir), "RUN")
        for call in r.get("tool_calls") or []:
            call["seconds"] = None
    return rows


def _weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(ckpt / "model.safetensors"))


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def _kill9_when(args: list, target: Path) -> None:
    """Start `atom ARGS`, and kill -9 it the moment `target` exists (it must still be running then)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "atomcli", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "run-all finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runall") / "run"
    atom("run-all", "--preset", "quick", "--out", out, check=True, timeout=900)
    return out


def test_quick_demo_writes_every_artifact(quick_run):
    for t in (1, 2):
        d = quick_run / "steps" / f"{t:04d}"
        for name in TABLES:
            assert (d / f"{name}.parquet").exists()
        assert (d / "ckpt" / "model.safetensors").exists()
        assert (d / "ckpt" / "optimizer.pt").exists()
    metrics = [json.loads(x) for x in (quick_run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["alpha"] == pytest.approx(0.5) and metrics[1]["alpha"] == pytest.approx(0.25)
    # every diagnostic is written under the one name the report reads (step_metrics)
    for key in (sm.REWARD_STD, sm.ZERO_VAR_GROUPS, sm.ENTROPY, sm.CLIP_LOW, sm.CLIP_HIGH, sm.GRAD_NORM,
                sm.RESPONSE_TOKENS, sm.SEARCHES, sm.BROWSES, sm.FORMAT_ERROR, sm.JUDGE_FALLBACKS, sm.SKIPPED):
        assert all(key in m for m in metrics), key
    assert all(m[sm.RESPONSE_TOKENS] > 0 and 0 <= m[sm.ZERO_VAR_GROUPS] <= 1 for m in metrics)
    assert {k for k, _ in sm.CURVES} >= set(sm.TABLE) - {sm.STEP, sm.LOSS}
    summary = (quick_run / "summary.md").read_text()
    # transfer to real documents is measured every run: after SFT and at the end, compared by question id
    assert "Transfer: real documents" in summary
    final = json.loads((quick_run / "eval" / "transfer" / "step-0002.json").read_text())
    assert final["n"] == 2 and final["compare"]["baseline"] == "sft" and final["compare"]["n_shared"] == 2
    assert set(final["by_source"]) <= {"sqlite_1hop", "sqlite_2hop"}
    demo_final = json.loads((quick_run / "eval" / "step-0002.json").read_text())
    assert demo_final["compare"]["baseline"] == "base" and "per_question" in demo_final
    for name in ("base", "sft", "step-0002"):
        assert f"| {name} |" in summary
    assert (quick_run / "plots" / "training.png").stat().st_size > 1000
    assert (quick_run / "plots" / "eval_f1.png").stat().st_size > 1000
    # the rewarded table carries every stage's columns and provenance
    rewarded = tableio.read_table(str(quick_run / "steps" / "0001" / "rewarded.parquet"))
    from atomcli import schema
    stages = [r["stage"] for r in schema.provenance(rewarded)]
    assert stages[-3:] == ["rollout", "score-rrm", "aggregate-reward"]


def test_piped_chain_equals_run_all(quick_run, tmp_path):
    """The single commands, chained through stdin/stdout, reproduce run-all's tables and checkpoint."""
    q = run_all.QUICK
    model = quick_run / "tiny-model"
    search = f"local:{quick_run / 'world' / 'index.sqlite'}"
    cfg = tmp_path / "quick.toml"
    lines = []
    for sec in ("sft", "rollout", "grpo-step"):
        lines.append(f"[{sec}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in q[sec].items()]
    cfg.write_text("\n".join(lines) + "\n")

    sft_out = tmp_path / "sft"
    atom("sft", quick_run / "world" / "sft.parquet", "--model", model, "--config", cfg, "--seed", "0",
         "--out", sft_out, check=True)
    assert _same_weights(sft_out, quick_run / "sft")

    step = quick_run / "steps" / "0001"
    rollout = atom("rollout", step / "questions.parquet", "--model", quick_run / "sft", "--search", search,
                   "--config", cfg, "--seed", "0", "--out", "-", check=True)
    scored = atom("score-rrm", "-", "--judge", "heuristic", "--out", "-", input=rollout.stdout, check=True)
    atom("aggregate-reward", "-", "--step", "0", "--total-steps", "2", "--out", tmp_path / "rewarded.parquet",
         input=scored.stdout, check=True)
    assert _rows(tmp_path / "rewarded.parquet") == _rows(step / "rewarded.parquet")

    atom("grpo-step", tmp_path / "rewarded.parquet", "--model", quick_run / "sft", "--config", cfg,
         "--seed", "0", "--out", tmp_path / "ckpt", check=True)
    assert _same_weights(tmp_path / "ckpt", step / "ckpt")


def test_kill_then_resume_matches_uninterrupted(quick_run, tmp_path):
    out = tmp_path / "run"
    _kill9_when(["run-all", "--preset", "quick", "--out", out], out / "steps" / "0001" / "rollouts.parquet")
    assert not (out / "steps" / "0002" / "ckpt").exists()

    atom("run-all", "--preset", "quick", "--out", out, "--resume", check=True, timeout=900)
    for t in (1, 2):
        for name in TABLES:
            rel = Path("steps") / f"{t:04d}" / f"{name}.parquet"
            assert _rows(out / rel, out) == _rows(quick_run / rel, quick_run), rel
        assert _same_weights(out / "steps" / f"{t:04d}" / "ckpt", quick_run / "steps" / f"{t:04d}" / "ckpt")
    assert _rows(out / "eval" / "step-0002.parquet", out) == _rows(quick_run / "eval" / "step-0002.parquet", quick_run)


def test_existing_folder_needs_resume(tmp_path):
    (tmp_path / "atom_run.json").write_text("{}")  # a run folder (run-all's marker)
    (tmp_path / "x").write_text("1")
    p = atom("run-all", "--preset", "quick", "--out", tmp_path)
    assert p.returncode == 2 and b"--resume" in p.stderr
    (tmp_path / "atom_run.json").unlink()  # a folder run-all did not make: --resume would be refused too
    p = atom("run-all", "--preset", "quick", "--out", tmp_path)
    assert p.returncode == 2 and b"--resume" not in p.stderr


# --- presets and the curriculum -------------------------------------------------------------------

@pytest.mark.parametrize("name", run_all.presets.WRITTEN_OUT)
def test_examples_are_the_presets_written_out(name):
    import tomllib
    text = (ROOT / "examples" / f"{name}.toml").read_text()
    assert text == run_all.preset_toml(name)  # regenerate with run_all.preset_toml if this fails
    assert tomllib.loads(text) == run_all.PRESETS[name]


def test_file_curriculum_takes_the_file_in_order_and_wraps():
    assert run_all.plan_questions([1] * 5, 3, 2, "file") == [[0, 1], [2, 3], [4, 0]]


def test_question_hops_from_column_or_data_source():
    import pyarrow as pa
    t = pa.table({"data_source": ["demo_3hop", "nq", None], "id": ["a", "b", "c"]})
    assert run_all.question_hops(t) == [3, 1, 1]
    assert run_all.question_hops(t.append_column("hops", pa.array([2, 2, None]))) == [2, 2, 1]
    # a mixed file (demo rows without hops, real rows with them): per row, data_source fills the gaps
    mixed = pa.table({"data_source": ["demo_3hop", "sqlite_2hop", "nq"], "hops": pa.array([None, 2, None])})
    assert run_all.question_hops(mixed) == [3, 2, 1]


def test_atom_eval_with_the_run_config_matches_run_alls_eval(quick_run, tmp_path):
    """One eval path: `atom eval --model CKPT --config` with the run's sections gives run-all's numbers."""
    settings = json.loads((quick_run / "config.json").read_text())
    toml = tmp_path / "run.toml"
    toml.write_text(run_all.to_toml({k: settings[k] for k in ("rollout", "eval") if k in settings}))
    out = tmp_path / "sft.json"
    atom("eval", quick_run / "eval" / "questions.parquet", "--model", quick_run / "sft", "--search",
         settings["run-all"]["search"], "--config", toml, "--out", out, check=True, timeout=600)
    mine, theirs = json.loads(out.read_text()), json.loads((quick_run / "eval" / "sft.json").read_text())
    assert mine["per_question"] == theirs["per_question"] and mine["overall"] == theirs["overall"]
    assert mine["rollout"] == theirs["rollout"] and mine["rollout"]["date"] == settings["rollout"]["date"]


# --- DAPO dynamic sampling ----------------------------------------------------------------------

def test_groups_with_signal_reads_advantages_and_turn_advantages():
    import pyarrow as pa
    t = pa.table({"group_id": ["a", "a", "b", "b", "c", "c"], "advantage": [0.0, 0.0, 0.5, -0.5, 0.0, 0.0],
                  "turn_advantages": [[0.0], [0.0], [0.5], [-0.5], [0.0, 0.3], [0.0]]})
    assert run_all.groups_with_signal(t) == ["b", "c"]
    assert run_all.groups_with_signal(t.drop_columns(["turn_advantages"])) == ["b"]


def test_dynamic_sampling_rolls_out_reserve_rounds_when_groups_have_no_signal(tmp_path):
    """Outcome-only reward on a tiny random model: every answer scores F1 0, every group is flat, so
    each step rolls out its reserve round, counts the groups, and (nothing with signal) trains on the first."""
    cfg = tmp_path / "dyn.toml"
    cfg.write_text('[run-all]\nsteps = 1\neval_limit = 1\ndynamic_sampling = 1\ntransfer_limit = 1\n'
                   'eval_base = false\n[aggregate-reward]\nprocess = "none"\n')
    out = tmp_path / "run"
    atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, check=True, timeout=900)
    step = out / "steps" / "0001"
    first, extra = (tableio.read_table(str(p / "questions.parquet")).column("id").to_pylist()
                    for p in (step, step / "round-2"))
    assert len(first) == len(extra) == 2 and not set(first) & set(extra)  # the reserve: other questions
    rewarded = tableio.read_table(str(step / "round-2" / "rewarded.parquet"))
    assert set(rewarded.column("advantage").to_pylist()) == {0.0}
    line = json.loads((step / "metrics.json").read_text())
    assert line[sm.SAMPLED_GROUPS] == 4 and line[sm.KEPT_GROUPS] == 0 and not (step / "selected.parquet").exists()
    assert line[sm.ZERO_VAR_GROUPS] == 1.0  # the diagnostics still show the flat groups of the first round


def test_an_unknown_world_style_is_refused_before_anything_is_built(tmp_path):
    from atomcli.context import Context
    cfg = tmp_path / "style.toml"
    cfg.write_text('[run-all]\nworld_style = "noir"\n')
    with pytest.raises(InputError, match="world_style `noir`"):
        run_all.prepare(tmp_path / "a", "quick", str(cfg), Context(quiet=True), build=False)
    assert not (tmp_path / "a").exists()


def test_demo_world_is_built_for_the_rollouts_snippet_order(tmp_path):
    """`[rollout] search_options = "snippets=query"` with --demo: the world's experts searched with that engine,
    so the SFT rows show the snippets the rollouts will get."""
    from atomcli import schema
    from atomcli.context import Context
    cfg = tmp_path / "q.toml"
    cfg.write_text('[run-all]\nworld_style = "stepwise-real"\n[rollout]\nsearch_options = "snippets=query"\n')
    settings = run_all.prepare(tmp_path / "q", "quick", str(cfg), Context(quiet=True))
    world = Path(settings["run-all"]["train"]).parent
    sft = tableio.read_table(str(world / "sft.parquet"))
    assert schema.provenance(sft)[-1]["config"]["snippets"] == "query"
    assert settings["rollout"]["search_options"] == "snippets=query"


def test_dynamic_batch_keeps_groups_with_signal_across_rounds(tmp_path):
    """The selection path: rounds are rolled out until `questions_per_step` groups have signal; the kept
    groups (by round and group id, so a repeated id cannot pull in another round's rows) are written."""
    import types

    import pyarrow as pa

    signal = {"q1": False, "q2": True, "q3": False, "q4": False, "q5": True, "q6": True}

    def fake_round(run, t, folder, model, questions):  # two rows per question; advantage where `signal`
        ids = questions.column("id").to_pylist()
        rows = [(i, (0.5 if signal[i] else 0.0) * s) for i in ids for s in (1, -1)]
        out = folder / "rewarded.parquet"
        tableio.write_table(pa.table({"group_id": [g for g, _ in rows], "advantage": [a for _, a in rows]}), str(out))
        return out

    run = types.SimpleNamespace(cfg=types.SimpleNamespace(questions_per_step=2, dynamic_sampling=2),
                                read=lambda p: tableio.read_table(str(p)), log=lambda msg: None)
    train = pa.table({"id": list(signal)})
    first = fake_round(run, 0, tmp_path, "m", train.take([0, 1]))
    batch, counts = loop.dynamic_batch(run, 0, tmp_path, "m", train, [0, 1, 2, 3, 4, 5], first, sample=fake_round)
    kept = tableio.read_table(str(batch))
    assert batch == tmp_path / "selected.parquet" and counts == (6, 2)  # three rounds of 2 were needed
    assert kept.column("group_id").to_pylist() == ["q2", "q2", "q5", "q5"]
    assert (tmp_path / "round-3" / "rewarded.parquet").exists() and not (tmp_path / "round-4").exists()
    again = loop.dynamic_batch(run, 0, tmp_path, "m", train, [0, 1, 2, 3, 4, 5], first, sample=fake_round)  # resume: same
    assert again == (batch, counts) and tableio.read_table(str(batch)).equals(kept)


# --- the resident loop: the policy stays in memory, checkpoints every save_every steps ------------

# Real updates on the quick demo: its tiny random model earns the same reward on every trajectory
# (every advantage 0, no gradient), so the entropy and KL terms make every step move the weights and
# the AdamW moments, and from step 2 on the KL reference (the SFT checkpoint) is loaded.
MOVING = ("[run-all]\nsteps = 3\neval_every = 1\neval_base = false\n"
          "[grpo-step]\nentropy_coef = 0.05\nbeta = 0.05\n")


def _optimizer_equal(a: Path, b: Path) -> bool:
    import torch
    sa, sb = (torch.load(p / "optimizer.pt", weights_only=True) for p in (a, b))
    return sa["param_groups"] == sb["param_groups"] and sa["state"].keys() == sb["state"].keys() and all(
        sa["state"][k].keys() == sb["state"][k].keys() and all(torch.equal(sa["state"][k][n], sb["state"][k][n])
                                                               for n in sa["state"][k]) for k in sa["state"])


def _same_run(out: Path, ref: Path, steps=(1, 2, 3), evals=("step-0001", "step-0002", "step-0003")) -> None:
    for t in steps:
        for name in TABLES:
            rel = Path("steps") / f"{t:04d}" / f"{name}.parquet"
            assert _rows(out / rel, out) == _rows(ref / rel, ref), rel
    last = Path("steps") / f"{steps[-1]:04d}" / "ckpt"
    assert _same_weights(out / last, ref / last) and _optimizer_equal(out / last, ref / last)
    for name in evals:
        assert _rows(out / "eval" / f"{name}.parquet", out) == _rows(ref / "eval" / f"{name}.parquet", ref), name
    drop = lambda m: {k: v for k, v in m.items() if k not in ("time_min", "tokens_per_s")}  # noqa: E731  (clocks)
    lines = lambda d: [drop(json.loads(x)) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert lines(out) == lines(ref)


@pytest.fixture(scope="module")
def moving_run(tmp_path_factory) -> Path:
    """MOVING with a checkpoint every step (save_every unset = 1)."""
    base = tmp_path_factory.mktemp("moving")
    (base / "moving.toml").write_text(MOVING)
    out = base / "run"
    atom("run-all", "--preset", "quick", "--config", base / "moving.toml", "--out", out, check=True, timeout=900)
    return out


def test_moving_run_really_trains(moving_run):
    metrics = [json.loads(x) for x in (moving_run / "metrics.jsonl").read_text().splitlines()]
    assert all(m["grad_norm"] > 0 for m in metrics)
    assert not _same_weights(moving_run / "sft", moving_run / "steps" / "0001" / "ckpt")
    assert not _same_weights(moving_run / "steps" / "0002" / "ckpt", moving_run / "steps" / "0003" / "ckpt")
    assert all((moving_run / "steps" / f"{t:04d}" / "ckpt" / "optimizer.pt").exists() for t in (1, 2, 3))


def test_save_every_thins_checkpoints_and_resume_redoes_the_unsaved_steps(moving_run, tmp_path):
    """save_every = 2: checkpoints at steps 2 and 3 only, the same tables, evals and final weights and
    AdamW state as saving every step. Killed after step 1 (whose checkpoint is never written), --resume
    restarts from SFT with step 1's tables, removes the started step 2 and ends the same; the eval of
    step 1, made from the policy in memory, equals `atom eval` of the saved step-1 checkpoint."""
    cfg = tmp_path / "k2.toml"
    cfg.write_text(MOVING.replace("[run-all]\n", "[run-all]\nsave_every = 2\n"))
    out = tmp_path / "run"
    # step 1 done (tables, metrics, eval), step 2 begun
    _kill9_when(["run-all", "--preset", "quick", "--config", cfg, "--out", out],
                out / "steps" / "0002" / "questions.parquet")
    step1 = out / "steps" / "0001"
    assert (step1 / "metrics.json").exists() and (out / "eval" / "step-0001.json").exists()
    assert not (step1 / "ckpt").exists() and not (out / "steps" / "0002" / "ckpt").exists()

    atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, "--resume", check=True, timeout=900)
    assert [(out / "steps" / f"{t:04d}" / "ckpt").exists() for t in (1, 2, 3)] == [False, True, True]
    _same_run(out, moving_run)
    # the saved checkpoint's chain names the step that was only in memory
    state = json.loads((out / "steps" / "0002" / "ckpt" / "atom_state.json").read_text())
    assert [h["step"] for h in state["history"]] == [0, 1, 2] and state["updates"] == 2
    assert state["history"][-1]["from"] == str((step1 / "ckpt").resolve())

    settings = json.loads((out / "config.json").read_text())
    toml = tmp_path / "eval.toml"
    toml.write_text(run_all.to_toml({k: settings[k] for k in ("rollout", "eval") if k in settings}))
    atom("eval", out / "eval" / "questions.parquet", "--model", moving_run / "steps" / "0001" / "ckpt", "--search",
         settings["run-all"]["search"], "--config", toml, "--out", tmp_path / "step1.json", check=True, timeout=600)
    mine, memory = (json.loads(p.read_text()) for p in (tmp_path / "step1.json", out / "eval" / "step-0001.json"))
    assert mine["per_question"] == memory["per_question"] and mine["overall"] == memory["overall"]

    # killed after step 3's rollouts and before its checkpoint: resumed from step 2's saved checkpoint
    # (weights and optimizer.pt from disk), step 3 is rolled out and trained again, and ends the same
    import shutil
    step3 = out / "steps" / "0003"
    shutil.rmtree(step3 / "ckpt")
    for p in [step3 / "metrics.json", step3 / "rollouts.parquet", step3 / "scored.parquet",
              step3 / "rewarded.parquet", out / "summary.md", *out.glob("eval/step-0003.*"),
              *out.glob("eval/transfer/step-0003.*")]:
        p.unlink()
    atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, "--resume", check=True, timeout=900)
    assert (step3 / "ckpt" / "optimizer.pt").exists() and (out / "summary.md").exists()
    _same_run(out, moving_run)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_resident_policy_continues_exactly_like_its_saved_checkpoint(moving_run, tmp_path, lora):
    """At the stage level: grpo-step continued from the in-memory policy equals grpo-step continued from
    the folder it was saved to (weights, AdamW state, metrics), and its sampler holds the saved weights."""
    import dataclasses

    import torch
    from safetensors.torch import load_file

    from atomcli import checkpoint
    from atomcli.context import Context
    from atomcli.stages import grpo_step
    from atomcli.train.resident import ResidentPolicy

    settings = json.loads((moving_run / "config.json").read_text())
    cfg = dataclasses.replace(grpo_step.GRPOConfig(**settings["grpo-step"]), model=str(moving_run / "sft"),
                              lora=lora, lora_r=4)
    tables = [tableio.read_table(str(moving_run / "steps" / f"{t:04d}" / "rewarded.parquet")) for t in (1, 2)]
    ctx = Context(quiet=True)
    first = grpo_step.run(tables[0], cfg, ctx)
    one = tmp_path / "one"
    state = checkpoint.make_state(first, stage="grpo-step", config=cfg)
    checkpoint.save(first, str(one), stage="grpo-step", config=cfg, context=ctx, state=state)
    ctx.resident = ResidentPolicy.first(str(one), first, state)
    sampler, _ = ctx.model(str(one))
    saved = load_file(str(one / "model.safetensors"))
    live = sampler.state_dict()
    assert all(torch.equal(live[k], saved[k]) for k in saved)
    # rollout --precision bf16: a bfloat16 copy of those weights, made once per update
    cast, _ = ctx.model(str(one), dtype="bfloat16")
    assert ctx.model(str(one), dtype="bfloat16")[0] is cast and cast is not sampler
    low = cast.state_dict()
    assert all(torch.equal(low[k], saved[k].to(torch.bfloat16)) for k in saved)
    assert all(v.dtype == torch.float32 for v in sampler.state_dict().values())

    nxt = dataclasses.replace(cfg, model=str(one))
    mem = grpo_step.run(tables[1], nxt, ctx)
    disk = grpo_step.run(tables[1], nxt, Context(quiet=True))
    assert mem.step == disk.step == 2 and mem.extra == disk.extra and mem.ref == disk.ref and mem.base == disk.base
    def measured(m: dict) -> dict:  # without clocks and memory
        return {k: v for k, v in m.items() if not any(c in k for c in ("second", "per_s", "peak", "updates"))}
    assert measured(mem.metrics) == measured(disk.metrics) and measured(mem.metrics)["grad_norm"] > 0
    wa, wb = ((checkpoint.merged_state_dict(r.model) if lora else r.model.state_dict()) for r in (mem, disk))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = mem.optimizer_state, disk.optimizer_state
    assert oa["state"].keys() == ob["state"].keys()
    assert all(torch.equal(oa["state"][k][n], ob["state"][k][n]) for k in oa["state"] for n in oa["state"][k])


def test_save_every_is_checked_at_start(tmp_path):
    """A negative save_every, or save_every > 1 with a served policy (synced from each checkpoint on disk),
    or a negative max_hops, is refused before anything is built."""
    from atomcli.context import Context
    served = {"model": "openai:http://127.0.0.1:9/v1#m", "policy_sync": "sglang-disk"}
    for extra, message in (({"save_every": -1}, "save_every must be >= 0"),
                           ({"max_hops": -1}, "max_hops must be >= 0"),
                           ({**served, "save_every": 2}, "save_every must be 1")):
        cfg = tmp_path / "c.toml"
        cfg.write_text(run_all.to_toml({"run-all": extra}))
        settings = run_all.prepare(tmp_path / "run", "quick", str(cfg), Context(quiet=True), build=False)
        with pytest.raises(InputError, match=message):
            run_all.Run(tmp_path / "run", settings, Context(quiet=True))
    settings["run-all"]["save_every"] = 1
    assert run_all.Run(tmp_path / "run", settings, Context(quiet=True)).save_every == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.toml")))
def test_every_shipped_example_starts_a_demo_run(tmp_path, example):
    """Each examples/*.toml is a --config that `atom run-all --preset demo` accepts as it says (every section known,
    every setting valid, the Run built; nothing written): a shipped example that is refused is a bug a user meets
    first."""
    from atomcli.context import Context
    settings = run_all.prepare(tmp_path / "run", "demo", str(ROOT / "examples" / example), Context(quiet=True),
                               build=False)
    run = run_all.Run(tmp_path / "run", settings, Context(quiet=True))
    if example == "information-gain.toml":
        assert run.aggregate.process == "ig" and run.aggregate.credit == "turn" and run.ig.ig == "prob"
    assert not (tmp_path / "run").exists()


def test_the_gpu_example_is_a_run_that_follows_its_trainer(tmp_path):
    """examples/gpu-7b.toml passes every start-of-run check (the same Run a real start builds, nothing
    written, no server contacted) and describes a served policy that follows a LoRA trainer that fits one
    GPU (docs/scale.md) through full merged weights on disk."""
    from atomcli.context import Context
    settings = run_all.prepare(tmp_path / "run", None, str(ROOT / "examples" / "gpu-7b.toml"),
                               Context(quiet=True), build=False)
    run = run_all.Run(tmp_path / "run", settings, Context(quiet=True))
    assert run.follow is not None and run.follow.method.name == "sglang-disk"
    assert run.grpo.lora and run.grpo.gradient_checkpointing and run.save_every == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["shuffle", "hops", "sources", "bogus"])
def test_removed_and_unknown_curricula_are_refused_listing_the_valid_ones(name):
    with pytest.raises(InputError, match=f"unknown curriculum `{name}`") as e:
        run_all.plan_questions([1, 2], 1, 1, name)
    assert "file, balanced" in e.value.hint


def test_balanced_curriculum_gives_every_step_each_hop_count():
    hops = [1] * 30 + [2] * 6 + [3] * 2  # unequal pools: the small ones cycle, the big one does not
    plan = run_all.plan_questions(hops, steps=5, per_step=4, curriculum="balanced", seed=0, max_hops=2)
    for p in plan:
        assert sorted(hops[i] for i in p) == [1, 1, 2, 2]
    ones = [i for p in plan for i in p if hops[i] == 1]
    twos = [i for p in plan for i in p if hops[i] == 2]
    assert len(set(ones)) == 10  # 10 of 30 drawn, none twice
    assert set(twos) == set(range(30, 36)) and len(twos) == 10  # all 6 drawn before any repeats
    assert plan == run_all.plan_questions(hops, 5, 4, "balanced", 0, max_hops=2)  # resume redraws it
    assert plan != run_all.plan_questions(hops, 5, 4, "balanced", 1, max_hops=2)  # the seed matters
    rare = run_all.plan_questions([1] * 30 + [2], steps=3, per_step=4, curriculum="balanced")
    for p in rare:  # one 2-hop question: it gives its second turn of a step away instead of repeating
        assert len(set(p)) == 4 and sorted(([1] * 30 + [2])[i] for i in p) == [1, 1, 1, 2]
    hops3 = [1, 2, 3] * 4  # more counts than a step has questions: the turn carries over to the next step
    odd = run_all.plan_questions(hops3, steps=2, per_step=2, curriculum="balanced")
    assert [sorted(hops3[i] for i in p) for p in odd] == [[1, 2], [1, 3]]


def test_max_hops_leaves_harder_questions_out_of_every_step():
    hops = [1, 2, 3, 4] * 25
    for curriculum in run_all.CURRICULA:
        plan = run_all.plan_questions(hops, steps=10, per_step=4, curriculum=curriculum, seed=0, max_hops=2)
        assert all(hops[i] <= 2 for p in plan for i in p) and all(len(p) == 4 for p in plan)
    plan = run_all.plan_questions(hops, steps=10, per_step=4, curriculum="balanced", seed=0, max_hops=2)
    flat = [i for p in plan for i in p]
    assert len(set(flat)) == 40 and {hops[i] for i in flat} == {1, 2}  # both levels, no question twice
    assert run_all.plan_questions(hops, 10, 4, "balanced", 0, max_hops=0) != plan  # 0: every hop count
    with pytest.raises(InputError, match="max_hops"):
        run_all.plan_questions([3, 4], steps=1, per_step=1, curriculum="balanced", max_hops=2)


def test_held_out_dev_questions_are_never_drawn_by_a_step():
    hops = [1, 2, 3, 4] * 25
    plan = run_all.plan_questions(hops, steps=10, per_step=4, curriculum="balanced", seed=0, max_hops=2)
    dev = run_all.held_out(plan, len(hops), 20)
    drawn = {i for p in plan for i in p}
    assert len(dev) == 20 and not drawn & set(dev)
    assert {hops[i] for i in dev} == {1, 2, 3, 4}  # max_hops bounds the steps, not the dev split
    assert dev == sorted(dev) and dev[0] == min(set(range(100)) - drawn)  # file order: resume finds the same
    assert len(run_all.held_out(plan, len(hops), 1000)) == 100 - len(drawn)


def test_held_out_dev_questions_are_never_sft_questions():
    # the learn preset's first 50 training questions were all among its expert SFT rows
    import pyarrow as pa
    train = pa.table({"id": [f"q{i}" for i in range(10)]})
    sft_data = pa.table({"id": ["q0", "q1", "q2", "q7", "q7", "other"]})
    seen = run_all.sft_rows(train, sft_data)
    assert seen == {0, 1, 2, 7}
    assert run_all.held_out([[3]], 10, 4, seen) == [4, 5, 6, 8]
    assert run_all.held_out([[3]], 10, 4) == [0, 1, 2, 4]  # without the SFT data: file order, as before
    assert run_all.held_out([], 10, 100, seen) == [3, 4, 5, 6, 8, 9]  # too few: run-all refuses (below)
    assert run_all.sft_rows(train, pa.table({"question": ["x"]})) == frozenset()  # no ids to match


def _fake_reports(out: Path, split: str, f1: dict) -> None:
    (out / "eval" / split).mkdir(parents=True, exist_ok=True)
    for name, v in f1.items():
        (out / "eval" / split / f"{name}.json").write_text(json.dumps({"overall": {"f1": v}}))


def test_the_final_checkpoint_is_the_best_on_dev_not_on_test(tmp_path):
    from types import SimpleNamespace
    names = ["sft", "step-0005", "step-0010"]
    _fake_reports(tmp_path, "", {"sft": 0.4, "step-0005": 0.3, "step-0010": 0.6})  # test would pick step 10
    _fake_reports(tmp_path, run_all.DEV, {"sft": 0.5, "step-0005": 0.7, "step-0010": 0.5})
    run = SimpleNamespace(out=tmp_path, candidates=[(n, f"ckpt/{n}") for n in names],
                          cfg=SimpleNamespace(dev_questions=50), log=lambda msg: None)
    assert run_all.choose_final(run) == ("step-0005", "ckpt/step-0005")
    final = json.loads((tmp_path / run_all.FINAL_FILE).read_text())
    assert final["dev_f1"] == 0.7 and final["test_f1"] == 0.3 and len(final["candidates"]) == 3
    _fake_reports(tmp_path, run_all.DEV, {"sft": 0.7, "step-0005": 0.7, "step-0010": 0.5})
    assert run_all.choose_final(run)[0] == "step-0005"  # a tie goes to the later eval point


def test_dev_split_is_evaluated_at_every_eval_point_and_keeps_their_checkpoints(tmp_path):
    cfg = tmp_path / "dev.toml"
    # save_every = 2 would keep step 2 only: with a dev split the eval point at step 1 is kept too
    cfg.write_text("[run-all]\nsteps = 2\neval_every = 1\neval_base = false\nsave_every = 2\ndev_questions = 3\n")
    out = tmp_path / "run"
    atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, check=True, timeout=900)
    names = {"sft", "step-0001", "step-0002"}
    assert {p.stem for p in (out / "eval" / run_all.DEV).glob("*.json")} == names
    assert (out / "steps" / "0001" / "ckpt" / "config.json").exists()
    dev = tableio.read_table(str(out / "eval" / run_all.DEV / "questions.parquet")).column("id").to_pylist()
    drawn = {i for t in (1, 2) for i in
             tableio.read_table(str(out / "steps" / f"{t:04d}" / "questions.parquet")).column("id").to_pylist()}
    assert len(dev) == 3 and not drawn & set(dev)
    sft_ids = set(tableio.read_table(str(out / "world" / "sft.parquet")).column("id").to_pylist())
    assert sft_ids and not sft_ids & set(dev)  # the dev split is held out from the SFT too
    final = json.loads((out / run_all.FINAL_FILE).read_text())
    assert {c["name"] for c in final["candidates"]} == names
    best = max(c["dev_f1"] for c in final["candidates"])
    assert final["dev_f1"] == best and (out / final["checkpoint"].replace(str(out) + "/", "")).exists()
    # transfer: the SFT and the final checkpoint only (the last step's is not run unless it is the final)
    assert {p.stem for p in (out / "eval" / run_all.TRANSFER).glob("*.json")} == {"sft", final["name"]}
    assert f"Final checkpoint: **{final['name']}**" in (out / "summary.md").read_text()


def test_too_many_dev_questions_is_refused(tmp_path):
    cfg = tmp_path / "dev.toml"
    cfg.write_text("[run-all]\nsteps = 2\ndev_questions = 1000\n")
    p = atom("run-all", "--preset", "quick", "--config", cfg, "--out", tmp_path / "run")
    assert p.returncode == 2 and b"dev_questions" in p.stderr
    assert not (tmp_path / "run" / "steps").exists() and not (tmp_path / "run" / "sft").exists()


def test_resume_takes_a_setting_added_since_the_run_started_at_its_default(tmp_path):
    """A run recorded before `rft_soup` existed resumes when this run sets it to its default (off), and is refused,
    naming it, when a preset turns it on."""
    (tmp_path / "config.json").write_text(json.dumps({"run-all": {"rft_rounds": 2}, "sft": {"lr": 2e-4}}))
    folder.check_same_settings(tmp_path, {"run-all": {"rft_rounds": 2, "rft_soup": False}, "sft": {"lr": 2e-4}})
    with pytest.raises(InputError, match=r"rft_soup: \(unset\) -> true"):
        folder.check_same_settings(tmp_path, {"run-all": {"rft_rounds": 2, "rft_soup": True}, "sft": {"lr": 2e-4}})
    with pytest.raises(InputError, match=r"\[sft\] lr"):  # other sections, and changed values, are as before
        folder.check_same_settings(tmp_path, {"run-all": {"rft_rounds": 2}, "sft": {"lr": 1e-4}})
