"""The served paths against a real OpenAI-compatible server: `transformers serve` on 127.0.0.1.

The server is the one the `serving` extra installs (FastAPI + Uvicorn); it is started once for
this module with the tiny test model folder, and killed (its whole process group: each model it
loads runs in a child process) at teardown. Nothing here falls back to tests/fake_openai.py: if
the server cannot start, the tests fail. The fake server stays for the faults a real server
cannot be asked to produce on cue (test_engines_openai.py, test_policy_sync.py).

What `transformers serve` (5.x) does not do, read in its source (transformers/cli/serving/):
it refuses vLLM's extension fields (HTTP 422) and token-id prompts (400, "prompt must be a
string"), and its completions carry neither token ids nor log-probs (`logprobs` is listed as an
unused field; the text is decoded with `skip_special_tokens=True`). So every served rollout here
takes the re-tokenized route: its sampled ids are the local tokenizer's reading of the text, and
its old log-probs are NaN (grpo-step recomputes them: `--old-logprobs recompute`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import atom

from atomcli import schema, tableio
from atomcli.engines import policy_sync

START_TIMEOUT_S = 240  # the server's start-up (imports) under a loaded CPU; a model loads on first use after it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def tserve(tmp_path_factory):
    """`transformers serve --host 127.0.0.1 --port FREE --device cpu`: yields its base url (…/v1)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        pytest.fail('transformers serve needs the serving extra: pip install -e ".[test]" (or ".[serve]")')
    exe = Path(sys.executable).with_name("transformers")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("tserve") / "serve.log"
    # one torch thread per model process: on a shared 2-core machine, torch's default (a thread per core)
    # spins against the test process and makes each generated token many times slower
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                if _get(base + "/health", timeout=2).get("status") == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"transformers serve did not answer /health in {START_TIMEOUT_S} s: "
                            f"{log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield base + "/v1"
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):  # the server and its model processes
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world")
    atom("demo-world", "-o", out, "--articles", 100, "--train", 4, "--test", 4, "--sft", 2, check=True)
    return out


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model))


def rollout_args(world: Path, model: str, out: Path, *extra) -> list:
    return ["rollout", world / "test.jsonl", "--model", model, "--search", f"local:{world / 'index.sqlite'}",
            "--limit", 2, "--group-size", 2, "--max-turns", 2, "--max-new-tokens", 8, "--seed", 3,
            "--date", "2026-01-01", "-o", out, *extra]


@pytest.fixture(scope="module")
def served_rollouts(tserve, tiny_model, world, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("served") / "rollouts.parquet"
    atom(*rollout_args(world, f"openai:{tserve}#{tiny_model}", out, "--temperature", 1.0), check=True, timeout=600)
    return out


def test_rollout_through_transformers_serve(served_rollouts, tok):
    table = tableio.read_table(str(served_rollouts))
    rows = table.to_pylist()
    assert len(rows) == 4 and not [r["error"] for r in rows if r["finish_reason"] == "error"]
    rec = schema.token_source(table)
    # it refused the vLLM fields and the token-id prompt; the engine learned both and says what it got
    assert (rec["tokens"], rec["prompt"], rec["server_kind"]) == ("retokenized", "text", "transformers")
    for row in rows:
        p, c, m, lp = row["prompt_ids"], row["completion_ids"], row["loss_mask"], row["old_logprobs"]
        assert len(c) == len(m) == len(lp) and sum(m) > 0
        assert tok.decode(p + c, skip_special_tokens=False) == tok.apply_chat_template(row["messages"], tokenize=False)
        sampled = [v for v, k in zip(lp, m) if k == 1]
        assert all(v is None or math.isnan(v) for v in sampled)  # unknown, and loudly so
    # it really sampled at temperature 1 (without `do_sample` from the engine, transformers serve decodes
    # greedily whenever the model's generation config leaves do_sample unset, as the tiny model's does)
    by_group: dict = {}
    for row in rows:
        by_group.setdefault(row["question"], []).append(row["messages"][2]["content"])
    assert all(len(set(turns)) > 1 for turns in by_group.values()), by_group


def test_greedy_served_rollout_and_in_process_rollout_agree(tserve, tiny_model, world, tmp_path):
    """At temperature 0 with the same weights both engines pick the same tokens, so their texts are equal.
    Their ids can differ, and only in one way: transformers serve returns text (decoded without special
    tokens), never ids, and the served row holds the local tokenizer's re-reading of that text, which
    merges what the model generated piecewise (the tiny random model's run of single newlines comes back
    as multi-newline tokens). So: the texts are equal, and the served ids are exactly the re-tokenized
    in-process text."""
    outs = {}
    for name, model in (("local", str(tiny_model)), ("served", f"openai:{tserve}#{tiny_model}")):
        outs[name] = tmp_path / f"{name}.parquet"
        atom(*rollout_args(world, model, outs[name], "--temperature", 0, "--group-size", 1, "--max-turns", 1,
                           "--max-new-tokens", 12), check=True, timeout=600)
    local, served = (tableio.read_table(str(outs[k])).to_pylist() for k in ("local", "served"))
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(local) == len(served) == 2
    for a, b in zip(local, served):
        assert a["prompt_ids"] == b["prompt_ids"]  # the same rendering of the same question
        assert a["messages"] == b["messages"]  # the same text, turn by turn
        ids_a = [i for i, k in zip(a["completion_ids"], a["loss_mask"]) if k == 1]
        ids_b = [i for i, k in zip(b["completion_ids"], b["loss_mask"]) if k == 1]
        text = tok.decode(ids_a, skip_special_tokens=True)
        assert ids_b == tok(text, add_special_tokens=False)["input_ids"]
        assert (ids_a == ids_b) == (tok(text, add_special_tokens=False)["input_ids"] == ids_a)


def test_a_server_that_refuses_every_request_stops_the_rollout(tserve, tiny_model, world, tmp_path):
    # a folder that is no model: transformers serve answers every completion with HTTP 400
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    out = tmp_path / "r.parquet"
    p = atom(*rollout_args(world, f"openai:{tserve}#{empty}", out, "--tokenizer", tiny_model), timeout=600)
    err = p.stderr.decode()
    assert p.returncode == 1, err
    assert "refused every request" in err and "HTTP 400" in err and "model_type" in err
    assert not out.exists()


def test_score_rrm_with_a_served_judge_records_failures_never_zero(tserve, tiny_model, tmp_path):
    think = "<think><PLAN>find the city</PLAN><REFLECTION>check it</REFLECTION></think>"
    rows = [{"traj_id": f"t{i}", "question": f"Where was person {i} born?",
             "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                          {"role": "assistant", "content": f"{think}<answer>Paris</answer>"}]} for i in range(2)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "c.toml"
    cfg.write_text("[score-rrm]\nretries = 1\nmax_new_tokens = 12\n")
    out = tmp_path / "scored.jsonl"
    atom("score-rrm", src, "--judge", f"openai:{tserve}#{tiny_model}", "--config", cfg, "-o", out,
         check=True, timeout=600)
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(scored) == 2
    for row in scored:
        # the tiny random model writes no list of scores: a recorded failure, never a score of 0
        assert row["rrm_error"] and row["atr"] is None
        assert all(t["score"] is None for t in row["atomic_thoughts"])


def test_eval_through_transformers_serve(tserve, tiny_model, world, tmp_path):
    report = tmp_path / "report.json"
    atom("eval", world / "test.jsonl", "--model", f"openai:{tserve}#{tiny_model}",
         "--search", f"local:{world / 'index.sqlite'}", "--limit", 2, "--max-turns", 1, "--max-new-tokens", 8,
         "-o", report, check=True, timeout=600)
    rep = json.loads(report.read_text())
    assert rep["overall"]["n"] == 2 and rep["overall"]["f1"] == 0.0  # a random model answers nothing right


def test_run_all_follows_the_trainer_on_transformers_serve(tserve, tiny_model, tmp_path):
    """Two GRPO steps: before each rollout the server loads the checkpoint it is for, by its path; the rows
    say which version answered; and a rollout that expects another version is refused."""
    from atomcli.stages import run_all as ra
    settings = {"run-all": {"model": f"openai:{tserve}#{tiny_model}", "policy_sync": "transformers-serve",
                            "sft_data": "", "eval_base": False, "eval_limit": 1, "questions_per_step": 1,
                            "transfer_test": "", "transfer_search": ""},
                "grpo-step": {"old_logprobs": "recompute"}}
    cfg = tmp_path / "c.toml"
    cfg.write_text(ra.to_toml(settings))
    out = tmp_path / "run"
    atom("run-all", "--preset", "quick", "--config", cfg, "--out", out, check=True, timeout=900)
    ckpts = [str(tiny_model)] + [str(out / "steps" / f"{t:04d}" / "ckpt") for t in (1, 2)]
    for t in (1, 2):
        rows = tableio.read_table(str(out / "steps" / f"{t:04d}" / "rollouts.parquet")).to_pylist()
        assert {r["policy_version"] for r in rows} == {policy_sync.policy_version(ckpts[t - 1])}
        assert {r["policy"] for r in rows} == {f"openai:{tserve}#{ckpts[t - 1]}"}
    final = tableio.read_table(str(out / "eval" / "step-0002.parquet")).to_pylist()
    assert {r["policy_version"] for r in final} == {policy_sync.policy_version(ckpts[2])}
    served = {m["id"] for m in _get(tserve + "/models")["data"]}
    assert ckpts[2] in served  # the server holds the last checkpoint, loaded by its path
    # a rollout that expects a version the server does not serve is refused before sampling (exit 2)
    wrong = tmp_path / "r.parquet"
    p = atom("rollout", out / "world" / "test.jsonl", "--model", f"openai:{tserve}#{ckpts[2]}",
             "--search", f"local:{out / 'world' / 'index.sqlite'}", "--policy-sync", "transformers-serve",
             "--policy-version", policy_sync.policy_version(ckpts[1]), "-o", wrong, timeout=600)
    assert p.returncode == 2 and "stale policy server" in p.stderr.decode() and not wrong.exists()
