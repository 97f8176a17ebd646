"""Hardening: faults (docs/RELIABILITY.md, "Faults").

- `kill -9` during `rollout`, `grpo-step` (mid-save) and `run-all`, then resume: no completed
  group lost, no partial checkpoint under the final name, the result equal to an
  uninterrupted run;
- judge and search servers that hang, reset connections, answer 500 or garbage: bounded
  time, the fault recorded (rrm_error / an error observation), never a crash or a silent 0;
- a full disk (RLIMIT_FSIZE in the child process) while writing a table, a checkpoint or an
  index: exit 1 and the previous output intact, no temporary files left.
"""

from __future__ import annotations

import re

import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from fake_openai import FakeOpenAI
from test_hardening_input import pipe  # noqa: F401  (module fixture: real tiny-model tables)
from typer.testing import CliRunner

from atomcli import schema
from atomcli.agent import format as agent_format
from atomcli.cli import app
from atomcli.context import Context
from atomcli.env.tools import ToolBox
from atomcli.retry import RetryPolicy
from atomcli.stages import rollout_io

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
TOKEN_COLUMNS = ["traj_id", "answer", "finish_reason", "prompt_ids", "completion_ids", "loss_mask"]


def popen(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "atomcli", *map(str, args)], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def run(*args, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atomcli", *map(str, args)], cwd=ROOT, env=ENV,
                          capture_output=True, timeout=timeout, **kw)


def wait_for(cond, proc: subprocess.Popen, timeout: float = 120.0, every: float = 0.005) -> bool:
    """Poll `cond()` until it holds; False if the process ended first."""
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        if proc.poll() is not None:
            return cond()
        time.sleep(every)
    raise AssertionError("timed out waiting")


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def rows_by_traj(table: pa.Table) -> dict:
    return {r["traj_id"]: {c: r[c] for c in TOKEN_COLUMNS} for r in table.select(TOKEN_COLUMNS).to_pylist()}


def weights(folder: Path) -> dict:
    from safetensors.numpy import load_file
    return load_file(str(folder / "model.safetensors"))


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


# --- kill -9 ------------------------------------------------------------------------------------

def test_kill9_during_rollout_then_resume_loses_no_group_and_equals_a_clean_run(pipe, tmp_path):  # noqa: F811
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where was person {i} born?",
                                             "golden_answers": ["Paris"]}) + "\n" for i in range(6)))
    # one group per batch, so an interrupted run and a clean one sample in the same batches
    args = ["--model", pipe.model, "--search", f"local:{pipe.index}", "--group-size", 2, "--batch-size", 2,
            "--max-turns", 2, "--max-new-tokens", 8, "--date", "2026-01-01", "--seed", 3]
    clean = popen("rollout", questions, "--out", tmp_path / "clean.parquet", *args)
    out = tmp_path / "r.parquet"
    partial = rollout_io.partial_dir(str(out))
    proc = popen("rollout", questions, "--out", out, *args)
    assert wait_for(lambda: len(list(partial.glob("*.parquet"))) >= 2, proc), proc.stderr.read().decode()[-2000:]
    kill9(proc)
    assert not out.exists()  # nothing under the final name
    saved = {f.name: pq.read_table(f) for f in sorted(partial.glob("*.parquet"))}  # every group file is whole
    done = {g for t in saved.values() for g in t.column("group_id").to_pylist()}
    assert 2 <= len(done) < 6, done
    assert all(t.num_rows == 2 for t in saved.values())  # a group is persisted whole or not at all

    resumed = run("rollout", questions, "--out", out, "--resume", *args)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert f"resume: {len(done)} groups already done" in " ".join(resumed.stderr.decode().split())
    assert clean.wait(timeout=300) == 0, clean.stderr.read().decode()[-2000:]
    final, reference = pq.read_table(out), pq.read_table(tmp_path / "clean.parquet")
    assert final.column("traj_id").to_pylist() == [f"q{i}/{s}" for i in range(6) for s in range(2)]
    assert rows_by_traj(final) == rows_by_traj(reference)  # equal to the uninterrupted run
    for t in saved.values():  # the groups made before the kill are kept as they were, not redone
        for tid, row in rows_by_traj(t).items():
            assert rows_by_traj(final)[tid] == row
    assert not partial.exists()
    assert schema.token_source(final)["stage"] == "rollout"


SLOW_SAVE = """
import os, sys, time
import transformers
orig = transformers.PreTrainedTokenizerBase.save_pretrained
def slow(self, path, *a, **k):
    out = orig(self, path, *a, **k)
    mark = os.environ["ATOM_TEST_MARK"]
    open(mark + ".tmp", "w").write(str(path))
    os.replace(mark + ".tmp", mark)  # the weights are written: we are mid-save
    time.sleep(60)
    return out
transformers.PreTrainedTokenizerBase.save_pretrained = slow
sys.argv = ["atom"] + sys.argv[1:]
from atomcli.cli import main
main()
"""


def test_kill9_mid_save_of_grpo_step_keeps_the_old_checkpoint_and_a_rerun_equals_a_clean_one(pipe, tmp_path):  # noqa: F811
    # the tiny model's rewards are all equal (advantage 0): give the step something to learn
    t = pipe.rewarded
    adv = schema.array("advantage", [(-1.0) ** i for i in range(t.num_rows)])
    data = tmp_path / "w.parquet"
    pq.write_table(t.set_column(t.column_names.index("advantage"), "advantage", adv)
                   .replace_schema_metadata(t.schema.metadata), data)
    # reference: one uninterrupted step
    args = [data, "--model", pipe.model, "--lr", "1e-3", "--seed", 1]
    ref = popen("grpo-step", *args, "--out", tmp_path / "ref")  # alongside the killed one
    # the final name already holds an older checkpoint (here: a copy of the starting model)
    import shutil
    out = tmp_path / "ckpt"
    shutil.copytree(pipe.model, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    mark = tmp_path / "mark"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, "grpo-step", *map(str, args), "--out", str(out)],
                            cwd=ROOT, env={**ENV, "ATOM_TEST_MARK": str(mark)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert wait_for(mark.exists, proc), proc.stderr.read().decode()[-2000:]
    being_saved = Path(mark.read_text())
    assert being_saved.parent == out.parent and being_saved.name.startswith(".ckpt.")  # a temporary folder
    assert (being_saved / "model.safetensors").exists()  # the new weights were half way in
    kill9(proc)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old checkpoint, untouched
    # the rerun (grpo-step has no --resume: it is one step, run again) equals the clean run
    again = run("grpo-step", *args, "--out", out)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()[-2000:]
    assert same_weights(out, tmp_path / "ref")
    assert not same_weights(out, pipe.model)  # and it did train
    state = json.loads((out / "atom_state.json").read_text())
    assert state["stage"] == "grpo-step" and state["step"] == 1


@pytest.mark.slow  # two whole runs side by side and a resume: ~45 s on an idle machine, 90 s on a busy one
def test_kill9_during_run_all_then_resume_equals_a_clean_run(pipe, tmp_path):  # noqa: F811
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Where was person {i} born?",
                                             "golden_answers": ["Paris"]}) + "\n" for i in range(4)))
    config = tmp_path / "run.toml"
    config.write_text(f"""
[run-all]
model = "{pipe.model}"
train = "{questions}"
test = "{questions}"
search = "local:{pipe.index}"
steps = 2
questions_per_step = 2
eval_limit = 1
eval_base = false
[rollout]
group_size = 2
batch_size = 2
max_turns = 2
max_new_tokens = 8
date = "2026-01-01"
[grpo-step]
lr = 1e-3
beta = 0.0
micro_batch = 2
[eval]
max_turns = 1
max_new_tokens = 4
""")
    clean = popen("run-all", "--config", config, "--out", tmp_path / "clean")
    out = tmp_path / "run"
    proc = popen("run-all", "--config", config, "--out", out)
    # kill once step 1 is finished and step 2 has persisted its first rollout group
    step2_partial = out / "steps" / "0002" / ".rollouts.parquet.partial"
    assert wait_for(lambda: any(step2_partial.glob("*.parquet")), proc), proc.stderr.read().decode()[-2000:]
    kill9(proc)
    assert (out / "steps" / "0001" / "ckpt" / "model.safetensors").exists()
    assert not (out / "steps" / "0002" / "rollouts.parquet").exists()
    resumed = run("run-all", "--config", config, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    assert clean.wait(timeout=600) == 0, clean.stderr.read().decode()[-2000:]
    ref = tmp_path / "clean"
    for step in ("0001", "0002"):
        for name in ("rollouts", "scored", "rewarded"):
            got, want = pq.read_table(out / "steps" / step / f"{name}.parquet"), \
                pq.read_table(ref / "steps" / step / f"{name}.parquet")
            assert rows_by_traj(got) == rows_by_traj(want), (step, name)
        assert same_weights(out / "steps" / step / "ckpt", ref / "steps" / step / "ckpt"), step
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]  # no step lost or doubled in the metrics
    assert (out / "summary.md").exists()
    leftovers = [p for p in out.rglob(".*") if p.name.endswith((".tmp", ".partial"))]
    assert leftovers == []


# --- judge servers that misbehave -----------------------------------------------------------------

QUESTION = "Who founded the Lyon observatory?"


def thought_table() -> pa.Table:
    """Three trajectories with atomic thoughts, so every row needs the judge."""
    turn = ("<think><PLAN>search for the founder</PLAN><REFLECTION>need a source</REFLECTION></think>"
            "<answer>Carol White</answer>")
    msgs = [[{"role": "user", "content": agent_format.user_message(QUESTION)},
             {"role": "assistant", "content": turn}]] * 3
    return pa.table({
        "id": schema.array("id", ["q1"] * 3), "question": schema.array("question", [QUESTION] * 3),
        "golden_answers": schema.array("golden_answers", [["Carol White"]] * 3),
        "traj_id": schema.array("traj_id", [f"q1/{i}" for i in range(3)]),
        "group_id": schema.array("group_id", ["q1"] * 3), "messages": schema.array("messages", msgs),
        "answer": schema.array("answer", ["Carol White"] * 3), "format_ok": schema.array("format_ok", [True] * 3)})


JUDGE_FAULTS = {
    "hangs": (("sleep", 30), "timed out"),
    "resets the connection": (ConnectionResetError("reset by the test"), "connection to judge failed"),
    "answers 500": (500, "HTTP 500"),
    "answers non-JSON": ({"not": "a chat completion"}, "not a chat completion"),
    "answers prose": ("I liked every thought very much.", "unparseable judge reply"),
    "answers 2 MB of brackets": ("[1, " * 500_000, "larger than"),
}


@pytest.mark.parametrize("fault", list(JUDGE_FAULTS))
def test_judge_server_faults_are_recorded_per_row_in_bounded_time(tmp_path, fault):
    reply, words = JUDGE_FAULTS[fault]
    src = tmp_path / "r.parquet"
    pq.write_table(thought_table(), src)
    out = tmp_path / "s.parquet"
    with FakeOpenAI(reply) as server:
        t0 = time.time()
        res = CliRunner().invoke(app, ["score-rrm", str(src), "--out", str(out), "--judge",
                                       f"openai:{server.base_url}#judge", "--timeout", "1", "--retries", "2",
                                       "--backoff", "0"])
        seconds = time.time() - t0
    assert res.exit_code == 0, res.stderr
    assert seconds < 20, seconds  # 3 rows x 2 attempts x 1 s timeout, concurrently
    rows = pq.read_table(out).to_pylist()
    for r in rows:
        assert r["atr"] is None and r["rrm_error"], r  # recorded, never a silent 0
        assert words in r["rrm_error"], r["rrm_error"]
        assert all(t["score"] is None for t in r["atomic_thoughts"])
    # downstream: aggregate-reward falls back to the outcome reward and counts it
    res = CliRunner().invoke(app, ["aggregate-reward", str(out), "--out", str(tmp_path / "w.parquet"),
                                   "--step", "0", "--total-steps", "2"])
    assert res.exit_code == 0, res.stderr
    w = pq.read_table(tmp_path / "w.parquet").to_pylist()
    assert [r["reward"] for r in w] == [r["f1"] for r in w] == [1.0] * 3
    assert re.search(r"judge fallbacks \(f1 only\)\s*│\s*3\b", res.stderr), res.stderr


# --- search and page servers that misbehave -------------------------------------------------------

class RawServer:
    """A TCP server on 127.0.0.1 that misbehaves in one way for every connection."""

    def __init__(self, mode: str):
        self.mode, self.connections = mode, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            conn.settimeout(5)
            conn.recv(65536)
            if self.mode == "hang":
                self._stop.wait(30)
            elif self.mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST, not FIN
            elif self.mode == "500":
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nboom")
            elif self.mode == "garbage":
                conn.sendall(b"\x00\x01\x02 not http at all \xff\xfe\r\n\r\n")
            elif self.mode == "short body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100000\r\n\r\n<p>cut")
            conn.close()
        except OSError:
            pass

    def close(self):
        self._stop.set()
        self.sock.close()


@pytest.fixture
def raw_server(request):
    server = RawServer(request.param)
    yield server
    server.close()


def _search_call(*queries):
    return agent_format.parse_tool_call(json.dumps({"name": "web_search", "arguments": {"query": list(queries)}}))


def _browse_call(url):
    return agent_format.parse_tool_call(json.dumps({"name": "browse_webpage",
                                                    "arguments": {"url_list": [url], "query": "river"}}))


@pytest.mark.parametrize("raw_server", ["hang", "reset", "500", "garbage"], indirect=True)
def test_search_server_faults_become_error_observations(raw_server, monkeypatch, tmp_path):
    """The web search (ddgs) goes through a proxy that misbehaves: every engine it tries fails."""
    monkeypatch.setenv("DDGS_PROXY", f"http://127.0.0.1:{raw_server.port}")
    tb = ToolBox("ddg", Context(quiet=True), retry=RetryPolicy(attempts=2, base=0.01),
                 search_options={"timeout": 1, "rate": 100}, cache=str(tmp_path / "cache.sqlite"))
    t0 = time.time()
    res = tb.run(_search_call("zorbl river"))
    tb.close()
    assert time.time() - t0 < 30
    assert not res.ok and res.error and res.observation.startswith('Results for "zorbl river":\nError: ')
    assert raw_server.connections >= 1  # the fault really came from the server
    from atomcli.env.cache import Cache
    cache = Cache(str(tmp_path / "cache.sqlite"))
    assert cache.get("search", "zorbl river", ok_only=True) is None  # a failure is never served as a result


@pytest.mark.parametrize("raw_server", ["reset", "garbage", "short body", "hang"], indirect=True)
def test_page_server_faults_become_error_observations(raw_server):
    from atomcli.env.fetch import FetchLimits
    tb = ToolBox("", Context(quiet=True), allow_hosts="127.0.0.1", retry=RetryPolicy(attempts=2, base=0.01),
                 limits=FetchLimits(connect_timeout=1, read_timeout=1, total_timeout=2))
    t0 = time.time()
    res = tb.run(_browse_call(f"http://127.0.0.1:{raw_server.port}/page"))
    tb.close()
    assert time.time() - t0 < 15
    assert not res.ok and res.observation.startswith("Page http://127.0.0.1:") and "Error: " in res.observation
    if raw_server.mode == "short body":  # a page cut short is a fault (retried), not the whole page
        assert "closed after" in res.error and raw_server.connections == 2
    assert raw_server.connections >= 1


# --- a full disk while writing ------------------------------------------------------------------------

def limited(nbytes: int):
    """preexec_fn: files this child writes may not grow past `nbytes` (write() fails with EFBIG,
    as it fails with ENOSPC on a full disk; Python ignores SIGXFSZ, so the error is an OSError)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def _no_temporaries(folder: Path, name: str) -> list:
    return [p.name for p in folder.iterdir() if p.name.startswith(f".{name}")]


def test_full_disk_while_writing_a_table_keeps_the_previous_one(pipe, tmp_path):  # noqa: F811
    for name in ("w.parquet", "w.jsonl"):
        out = tmp_path / name
        out.write_bytes(b"previous output\n")
        proc = run("aggregate-reward", pipe.rewarded_path, "--out", out, "--step", 1, "--total-steps", 2,
                   preexec_fn=limited(4096))
        assert proc.returncode == 1, proc.stderr.decode()[-1000:]
        assert b"File too large" in proc.stderr
        assert out.read_bytes() == b"previous output\n"
        assert _no_temporaries(tmp_path, name) == []


def test_full_disk_while_saving_a_checkpoint_keeps_the_previous_one(pipe, tmp_path):  # noqa: F811
    import shutil
    out = tmp_path / "ckpt"
    shutil.copytree(pipe.model, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    big = max(len(b) for b in before.values())
    proc = run("grpo-step", pipe.rewarded_path, "--model", pipe.model, "--out", out,
               preexec_fn=limited(big // 2))  # reading the model is fine; writing its weights is not
    assert proc.returncode == 1, proc.stderr.decode()[-1000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _no_temporaries(tmp_path, "ckpt") == []


def test_full_disk_while_building_an_index_keeps_the_previous_one(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T{i}", "contents": f"text {i} " * 50}) + "\n"
                              for i in range(2000)))
    out = tmp_path / "idx.sqlite"
    out.write_bytes(b"previous index")
    proc = run("index", corpus, "--out", out, preexec_fn=limited(64 * 1024))
    assert proc.returncode != 0 and out.read_bytes() == b"previous index", proc.stderr.decode()[-1000:]
    assert _no_temporaries(tmp_path, "idx.sqlite") == []
