"""A served policy that follows the trainer (atomcli/engines/policy_sync.py), against the fake server.

The fake's answers depend on what it serves (`server.policy_for`): each completion answers with the
name of the checkpoint folder whose weights (or adapter) would answer, so a table says which policy
really answered, and a test can tell the old policy from the new one.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from conftest import atom
from fake_openai import FakeOpenAI
from test_rollout import questions

from atomcli import tableio
from atomcli.context import Context
from atomcli.engines import policy_sync
from atomcli.errors import InputError
from atomcli.stages import rollout


def tag(policy: str | None) -> str:
    """The checkpoint a served path belongs to: steps/0001/ckpt -> 0001, X/adapter -> X, sft -> sft."""
    p = Path(str(policy))
    if p.name == "adapter":
        p = p.parent
    return p.parent.name if p.name == "ckpt" else p.name


def answering(server: FakeOpenAI, tok):
    """A vLLM-like completion: `<answer>TAG</answer>` with TAG the checkpoint that answers, as token ids."""
    def respond(body, path):
        text = f"<answer>{tag(server.policy_for(body['model']))}</answer>"
        ids = tok(text, add_special_tokens=False)["input_ids"][:body["max_tokens"]]
        return {"id": "cmpl", "object": "text_completion", "model": body["model"], "choices": [{
            "index": 0, "text": tok.decode(ids), "finish_reason": "stop",
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}]}
    return respond


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model))


def make_ckpt(root: Path, name: str, *, step: int = 1, adapter: bool = False) -> str:
    """A checkpoint folder as grpo-step writes it, with only the files a version is made of."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"w" * (10 + step))
    (d / "atom_state.json").write_text(json.dumps({"stage": "grpo-step", "step": step}))
    if adapter:
        (d / "adapter").mkdir()
        (d / "adapter" / "adapter_config.json").write_text("{}")
        (d / "adapter" / "adapter_model.safetensors").write_bytes(b"a" * step)
    return str(d)


def spec(server: FakeOpenAI) -> str:
    return f"openai:{server.base_url}#{server.model_name}"


def test_version_names_the_checkpoint_and_changes_with_it(tmp_path):
    a = make_ckpt(tmp_path, "a", step=3)
    v = policy_sync.policy_version(a)
    assert v.startswith("step0003-") and v == policy_sync.policy_version(a)
    (Path(a) / "model.safetensors").write_bytes(b"new weights, other size")
    assert policy_sync.policy_version(a) != v
    assert policy_sync.policy_version("Qwen/Qwen2.5-7B-Instruct").startswith("init-")
    assert policy_sync.trainer_model("openai:http://h:1/v1#org/m") == "org/m"
    assert policy_sync.trainer_model("smollm2") == "smollm2"


def test_unknown_method_is_a_usage_error():
    with pytest.raises(InputError, match="unknown policy sync method `vllm`.*command:CMD"):
        policy_sync.check_spec("vllm")
    with pytest.raises(InputError, match="names no command"):
        policy_sync.check_spec("command:  ")


def test_sglang_disk_serves_the_new_checkpoint(tmp_path):
    a, b = make_ckpt(tmp_path, "a", step=1), make_ckpt(tmp_path, "b", step=2)
    with FakeOpenAI(model_name="base") as server:
        method = policy_sync.make("sglang-disk", spec(server))
        served = method.sync(a, policy_sync.policy_version(a))
        assert (server.weights, server.weight_version) == (a, served.version) and served.model == "base"
        assert method.check(served) is None
        newer = method.sync(b, policy_sync.policy_version(b))
        assert server.weights == b and method.check(served) is not None  # the old version is no longer served
        assert [body["model_path"] for _, body in server.updates] == [a, b]
        # a path the server cannot read: its refusal, in one line with a hint
        with pytest.raises(policy_sync.PolicySyncError, match="update_weights_from_disk.*hint"):
            method.sync(str(tmp_path / "missing"), "step0009-x")
        assert method.check(newer) is None


def test_vllm_reload_serves_the_new_checkpoint_and_needs_dev_mode(tmp_path):
    a = make_ckpt(tmp_path, "a")
    with FakeOpenAI(model_name="base") as server:
        method = policy_sync.make("vllm-reload", spec(server))
        served = method.sync(a, "step0001-abc")
        assert (server.weights, server.weight_version) == (a, "step0001-abc") and method.check(served) is None
        assert server.updates[0] == ("/collective_rpc", {"method": "reload_weights", "kwargs": {
            "weights_path": a, "is_checkpoint_format": True}})
    with FakeOpenAI(model_name="base", dev_mode=False) as server, \
            pytest.raises(policy_sync.PolicySyncError, match="VLLM_SERVER_DEV_MODE=1"):
        policy_sync.make("vllm-reload", spec(server)).sync(a, "step0001-abc")


def test_lora_vllm_loads_a_new_adapter_per_version_and_rollouts_use_it(tmp_path, tiny_model, tok):
    a, b = make_ckpt(tmp_path, "a", step=1, adapter=True), make_ckpt(tmp_path, "b", step=2, adapter=True)
    ctx = Context(quiet=True)
    with FakeOpenAI(model_name="base", strict_models=True) as server:
        server.responder = answering(server, tok)
        follow = policy_sync.Follower(spec(server), "lora-vllm", ctx)
        base_cfg = rollout.RolloutConfig(search="fakesearch", group_size=2, max_turns=2, max_new_tokens=16,
                                         date="2026-01-01", tokenizer=str(tiny_model))
        answers = {}
        for ckpt in (a, b):
            cfg = follow.rollout_config(dataclasses.replace(base_cfg, model=ckpt))
            rows = rollout.run(questions(1), cfg, ctx).to_pylist()
            answers[tag(ckpt)] = {r["answer"] for r in rows}
            assert {r["policy_version"] for r in rows} == {policy_sync.policy_version(ckpt)}
            assert cfg.model.endswith("#policy-" + policy_sync.policy_version(ckpt))
        assert answers == {"a": {"a"}, "b": {"b"}}  # each rollout was answered by its own adapter
        # the previous adapter is unloaded once the new one serves; the same checkpoint is not reloaded
        assert list(server.adapters) == ["policy-" + policy_sync.policy_version(b)]
        assert [r for r, _ in server.updates] == ["/v1/load_lora_adapter", "/v1/load_lora_adapter",
                                                  "/v1/unload_lora_adapter"]
        follow.rollout_config(dataclasses.replace(base_cfg, model=b))
        assert len(server.updates) == 3
        # a checkpoint without an adapter cannot be served this way
        with pytest.raises(InputError, match="no LoRA adapter"):
            follow.method.sync(make_ckpt(tmp_path, "full", step=3), "step0003-x")
    with FakeOpenAI(model_name="base", runtime_lora=False) as server, \
            pytest.raises(policy_sync.PolicySyncError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING"):
        policy_sync.make("lora-vllm", spec(server)).sync(a, "step0001-abc")


def test_a_resumed_run_unloads_the_adapters_its_killed_process_left_loaded(tmp_path):
    a, b = make_ckpt(tmp_path, "a", step=1, adapter=True), make_ckpt(tmp_path, "b", step=2, adapter=True)
    run = tmp_path / "run"
    run.mkdir()
    with FakeOpenAI(model_name="base", strict_models=True) as server:
        # another run shares the server: its adapter is not ours to unload
        policy_sync.make("lora-vllm", spec(server)).sync(b, "other-run")
        first = policy_sync.make("lora-vllm", spec(server), state_dir=run)
        first.sync(a, "step0001-aaa")  # then the process is killed: nothing unloads policy-step0001-aaa
        assert json.loads((run / policy_sync.LEDGER).read_text()) == {"loaded_adapters": ["policy-step0001-aaa"]}
        resumed = policy_sync.make("lora-vllm", spec(server), state_dir=run)
        resumed.sync(b, "step0002-bbb")
        assert sorted(server.adapters) == ["policy-other-run", "policy-step0002-bbb"]
        assert json.loads((run / policy_sync.LEDGER).read_text()) == {"loaded_adapters": ["policy-step0002-bbb"]}
        # without the ledger (the old behaviour) the killed process's adapter would have stayed
        policy_sync.make("lora-vllm", spec(server)).sync(a, "step0003-ccc")
        assert "policy-step0002-bbb" in server.adapters
        # an adapter the server no longer has (it restarted) is dropped from the ledger, not retried forever
        (run / policy_sync.LEDGER).write_text(json.dumps({"loaded_adapters": ["policy-gone"]}))
        policy_sync.make("lora-vllm", spec(server), state_dir=run).sync(a, "step0004-ddd")
        assert json.loads((run / policy_sync.LEDGER).read_text()) == {"loaded_adapters": ["policy-step0004-ddd"]}


def test_a_stale_server_is_refused_by_the_rollout(tmp_path, tiny_model, tok):
    a = make_ckpt(tmp_path, "a")
    ctx = Context(quiet=True)
    with FakeOpenAI(model_name="base") as server:
        server.responder = answering(server, tok)
        version = policy_sync.make("sglang-disk", spec(server)).sync(a, policy_sync.policy_version(a)).version
        cfg = rollout.RolloutConfig(model=spec(server), tokenizer=str(tiny_model), search="fakesearch",
                                    group_size=1, max_new_tokens=16, date="2026-01-01",
                                    policy_sync="sglang-disk", policy_version=version)
        assert rollout.run(questions(1), cfg, ctx).column("policy_version").to_pylist() == [version]
        server.weight_version = "step0000-someone-else"  # another client changed the weights
        n = len(server.requests)
        with pytest.raises(InputError, match="stale policy server: expected policy .*someone-else"):
            rollout.run(questions(1), cfg, ctx)
        assert not any(r.path.endswith("/completions") for r in server.requests[n:])  # nothing sampled
        # the command line: exit 2, one line with a hint
        qfile = tmp_path / "q.jsonl"
        qfile.write_text(json.dumps({"id": "q0", "question": "Where?", "golden_answers": ["Paris"]}) + "\n")
        proc = atom("rollout", qfile, "--model", spec(server), "--tokenizer", tiny_model, "--search", "ddg",
                    "--policy-sync", "sglang-disk", "--policy-version", version, "--out", tmp_path / "r.parquet")
        err = proc.stderr.decode().strip()
        assert proc.returncode == 2 and "stale policy server" in err and "hint:" in err
        assert len(err.splitlines()) == 1 and not (tmp_path / "r.parquet").exists()
    with pytest.raises(InputError, match="needs --policy-sync"):
        rollout.validate(rollout.RolloutConfig(model="openai:http://h:1/v1#m", policy_version="v"))


SYNC_SCRIPT = '''
import json, os, sys
log = sys.argv[1]
calls = json.load(open(log)) if os.path.exists(log) else []
calls.append({"argv": sys.argv[2:], "env": {k: v for k, v in os.environ.items() if k.startswith("ATOM_POLICY_")}})
json.dump(calls, open(log, "w"))
if os.environ.get("FAIL_SYNC"):
    print("loading...", file=sys.stderr)
    print("boom: no space left", file=sys.stderr)
    sys.exit(3)
print("reloaded")
print(os.environ.get("SERVED_LINE", ""))
'''


def test_transformers_serve_loads_each_checkpoint_by_its_path(tmp_path, tiny_model, tok):
    a, b = make_ckpt(tmp_path, "s1", step=1), make_ckpt(tmp_path, "s2", step=2)
    ctx = Context(quiet=True)
    with FakeOpenAI(model_name=str(tiny_model), strict_models=True) as server:
        server.responder = answering(server, tok)
        follow = policy_sync.Follower(spec(server), "transformers-serve", ctx)
        base_cfg = rollout.RolloutConfig(search="fakesearch", group_size=1, max_turns=1, max_new_tokens=16,
                                         date="2026-01-01", tokenizer=str(tiny_model))
        for ckpt in (a, b):
            cfg = follow.rollout_config(dataclasses.replace(base_cfg, model=ckpt))
            assert cfg.model == f"openai:{server.base_url}#{ckpt}"  # the request names the checkpoint itself
            rows = rollout.run(questions(1), cfg, ctx).to_pylist()
            assert {r["policy_version"] for r in rows} == {policy_sync.policy_version(ckpt)}
            assert {r["answer"] for r in rows} == {tag(ckpt)}  # answered by that checkpoint's weights
        assert [body["model"] for _, body in server.updates] == [a, b]
        method = follow.method
        served = follow.current[1]
        assert method.check(served) is None
        # the files at the path changed after the load: the server may hold the older weights
        Path(b, "model.safetensors").write_bytes(b"changed")
        assert "may hold older weights" in method.check(served)
        # a folder the server cannot load: its error event, in one line with a hint
        (tmp_path / "empty").mkdir()
        with pytest.raises(policy_sync.PolicySyncError, match="did not end ready: Unrecognized model.*hint"):
            method.sync(str(tmp_path / "empty"), "v")
        with pytest.raises(InputError, match="serves checkpoint folders"):
            method.sync(str(tmp_path / "nowhere"), "v")
        # a rollout expecting a checkpoint the server has not loaded is refused before sampling
        c = make_ckpt(tmp_path, "s3", step=3)
        with pytest.raises(InputError, match="stale policy server.*has not loaded"):
            rollout.run(questions(1), dataclasses.replace(cfg, model=f"openai:{server.base_url}#{c}",
                                                          policy_sync="transformers-serve",
                                                          policy_version=policy_sync.policy_version(c)), ctx)


def test_command_gets_the_checkpoint_and_fails_cleanly(tmp_path, monkeypatch):
    a = make_ckpt(tmp_path, "a")
    script, log = tmp_path / "sync.py", tmp_path / "calls.json"
    script.write_text(SYNC_SCRIPT)
    with FakeOpenAI(model_name="base") as server:
        spec_ = f"command:{sys.executable} {script} {log}"
        method = policy_sync.Command(spec_, policy_sync.Server(spec(server)), backoff=0.01)
        served = method.sync(a, "step0001-abc")
        calls = json.loads(log.read_text())
        assert calls[0]["argv"] == [a, "step0001-abc"] and served == policy_sync.Served("base", "step0001-abc")
        assert calls[0]["env"] == {"ATOM_POLICY_CHECKPOINT": a, "ATOM_POLICY_VERSION": "step0001-abc",
                                   "ATOM_POLICY_SERVER": server.base_url, "ATOM_POLICY_MODEL": "base"}
        # a served_model= line names what rollouts ask for, and the server must list it
        monkeypatch.setenv("SERVED_LINE", "served_model=my-adapter")
        with pytest.raises(policy_sync.PolicySyncError, match="exited 0, but the server does not list `my-adapter`"):
            method.sync(a, "step0001-abc")
        monkeypatch.delenv("SERVED_LINE")
        # a nonzero exit is retried, then one line naming the command, the status and its last words
        log.unlink()
        monkeypatch.setenv("FAIL_SYNC", "1")
        with pytest.raises(policy_sync.PolicySyncError) as e:
            method.sync(a, "step0002-def")
        assert len(json.loads(log.read_text())) == 3
        msg = str(e.value)
        assert "failed after 3 attempts: exited 3: boom: no space left" in msg and "\n" not in msg
    with pytest.raises(InputError, match="not found"):
        policy_sync.Command("command:/no/such/sync-tool", policy_sync.Server("openai:http://127.0.0.1:9/v1#m")
                            ).sync(a, "v")


# --- run-all with a served policy -----------------------------------------------------------------

def write_config(path: Path, model: str, **run_all) -> Path:
    from atomcli.stages import run_all as ra
    settings = {"run-all": {"model": model, "transfer_test": "", "transfer_search": "", **run_all}}
    path.write_text(ra.to_toml(settings))
    return path


def test_run_all_refuses_a_served_policy_that_would_never_be_updated(tmp_path, tiny_model):
    from atomcli.stages import run_all
    model = f"openai:http://127.0.0.1:9/v1#{tiny_model}"
    for extra, match in (({}, "needs \\[run-all\\] policy_sync"),
                         ({"policy_sync": "lora-vllm"}, "trainer must write them"),
                         ({"policy_sync": "rsync"}, "unknown policy sync method")):
        out = tmp_path / f"run{len(extra)}{extra.get('policy_sync', '')}"
        cfg = write_config(tmp_path / "c.toml", model, **extra)
        with pytest.raises(InputError, match=match):
            run_all.main(out=str(out), config_file=str(cfg), demo=True, quick=True, resume=False,
                         context=Context(quiet=True))
        assert not out.exists() or not any(out.iterdir())  # refused before anything was written
    cfg = write_config(tmp_path / "c.toml", str(tiny_model), policy_sync="sglang-disk")
    with pytest.raises(InputError, match="applies only to a served policy"):
        run_all.main(out=str(tmp_path / "local"), config_file=str(cfg), demo=True, quick=True, resume=False,
                     context=Context(quiet=True))


def test_run_all_syncs_the_server_after_every_step(tmp_path, tiny_model, tok):
    from atomcli.stages import run_all
    out = tmp_path / "run"
    with FakeOpenAI(model_name=str(tiny_model)) as server:
        server.responder = answering(server, tok)
        cfg = write_config(tmp_path / "c.toml", f"openai:{server.base_url}#{tiny_model}", policy_sync="sglang-disk")
        run_all.main(out=str(out), config_file=str(cfg), demo=True, quick=True, resume=False,
                     context=Context(quiet=True))
        synced = [body["model_path"] for route, body in server.updates]
    ckpts = [str(out / "steps" / f"{t:04d}" / "ckpt") for t in (1, 2)]
    # the start, the SFT checkpoint, then each step's new checkpoint before the rollout after it
    assert synced == [str(tiny_model), str(out / "sft"), *ckpts]
    for t, (answered_by, ckpt) in enumerate((("sft", str(out / "sft")), ("0001", ckpts[0])), start=1):
        rows = tableio.read_table(str(out / "steps" / f"{t:04d}" / "rollouts.parquet")).to_pylist()
        assert {r["policy_version"] for r in rows} == {policy_sync.policy_version(ckpt)}
        assert {r["answer"] for r in rows} == {answered_by}  # the server really served that checkpoint
    final = tableio.read_table(str(out / "eval" / "step-0002.parquet")).to_pylist()
    assert {r["answer"] for r in final} == {"0002"}
    assert {r["policy_version"] for r in final} == {policy_sync.policy_version(ckpts[1])}
