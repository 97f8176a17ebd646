"""Hardening by class (docs/RELIABILITY.md, "Guards by class"): one test group per class of failure.

Outputs that destroy inputs or folders, resume that silently mixes runs, deadlines that do not
hold, keys that travel, terminal output from untrusted text, files that are not ours, and checks
that come late. Every guard lives in atomcli.safety (or the one module the class belongs to);
these tests go through the commands a user types. No model is loaded: a refusal happens before
any model would be, and rollout resume runs a stand-in for the rollout module.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import socket
import sqlite3
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from fake_openai import FakeOpenAI
from rich.console import Console
from typer.testing import CliRunner

from atomcli import config, openai_http, safety, schema, tableio
from atomcli.agent.format import parse_tool_call
from atomcli.cli import app
from atomcli.context import Context
from atomcli.env import search_local
from atomcli.env.cache import Cache
from atomcli.env.fetch import Fetcher, FetchLimits
from atomcli.env.tools import ToolBox
from atomcli.errors import InputError
from atomcli.retry import RetryPolicy, ToolFault
from atomcli.stages import aggregate_reward, rollout, rollout_io, run_all

ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]0;title\x07\u202eevil\x9b31m"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")


def cli(*args, input: bytes | str | None = None):
    res = CliRunner().invoke(app, [str(a) for a in args], input=input)
    return res.exit_code, res.stdout, res.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


QUESTIONS = [{"id": f"q{i}", "question": f"Where was person {i} born?", "golden_answers": ["Paris"]}
             for i in range(3)]
ANSWERED = [{**q, "answer": "Paris"} for q in QUESTIONS]


@pytest.fixture
def corpus_index(tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [
        {"id": "d1", "title": "Zorbl river", "contents": f"The Zorbl river {ESCAPES} flows north to Paris."},
        {"id": "d2", "title": "Other", "contents": "Nothing to see here."}])
    index = tmp_path / "idx.sqlite"
    search_local.build_index(str(corpus), str(index))
    return corpus, index


# --- 1. outputs that destroy inputs or folders ------------------------------------------------------

@pytest.mark.parametrize("flag", ["--out", "--markdown", "--history"])
def test_eval_never_writes_a_report_over_its_input(tmp_path, flag):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    before = digest(table)
    args = ["eval", table, "--out", tmp_path / "r.json"] if flag != "--out" else ["eval", table]
    code, out, err = cli(*args, flag, table)
    assert code == 2 and "is also an input" in err and digest(table) == before


def test_eval_outputs_may_not_collide_or_land_on_the_baseline(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    assert cli("eval", table, "--out", tmp_path / "r.json")[0] == 0
    base = tmp_path / "r.json"
    before = digest(base)
    code, _, err = cli("eval", table, "--compare", base, "--out", base)
    assert code == 2 and "is also an input" in err and digest(base) == before
    code, _, err = cli("eval", table, "--out", tmp_path / "x.md", "--markdown", tmp_path / "x.md")
    assert code == 2 and "name the same file" in err and not (tmp_path / "x.md").exists()


def test_show_html_never_replaces_the_table(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    before = digest(table)
    code, _, err = cli("show", table, "--html", table)
    assert code == 2 and "is also an input" in err and digest(table) == before


def test_table_stages_never_write_over_their_input_even_through_a_hard_link(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    link = tmp_path / "link.jsonl"
    link.hardlink_to(table)
    before = digest(table)
    for stage in ("score-rrm", "aggregate-reward"):
        for out in (table, link):
            code, _, err = cli(stage, table, "--out", out)
            assert code == 2 and "is also an input" in err, (stage, out, err)
    assert digest(table) == before


def test_rollout_never_writes_over_its_question_file(tmp_path):
    q = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    before = digest(q)
    code, _, err = cli("rollout", q, "--search", "ddg", "--out", q)
    assert code == 2 and "is also an input" in err and digest(q) == before
    assert not rollout_io.partial_dir(str(q)).exists()


def test_index_never_replaces_its_corpus_or_a_file_that_is_not_an_index(tmp_path, corpus_index):
    corpus, index = corpus_index
    before = digest(corpus)
    code, _, err = cli("index", corpus, "--out", corpus)
    assert code == 2 and digest(corpus) == before
    cache = tmp_path / "cache.sqlite"
    Cache(str(cache)).close()
    cached = digest(cache)
    code, _, err = cli("index", corpus, "--out", cache)
    assert code == 2 and "not a search index" in err and digest(cache) == cached
    assert cli("index", corpus, "--out", index)[0] == 0  # an index is rebuilt in place, as before


@pytest.mark.parametrize("stage", ["grpo-step", "sft"])
def test_training_stages_never_replace_a_folder_that_is_not_a_checkpoint(tmp_path, stage):
    data = write_jsonl(tmp_path / "d.jsonl", ANSWERED)
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "holiday.jpg").write_bytes(b"\xff\xd8 not ours")
    code, _, err = cli(stage, data, "--model", "smollm2", "--out", photos)
    assert code == 2 and "is not a checkpoint folder" in err
    assert tree(photos) == {"holiday.jpg": b"\xff\xd8 not ours"}


def test_training_stages_never_replace_their_model_or_a_folder_holding_their_data(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "atom_state.json").write_text("{}")
    data = write_jsonl(tmp_path / "d.jsonl", ANSWERED)
    code, _, err = cli("grpo-step", data, "--model", ckpt, "--out", ckpt)
    assert code == 2 and "is also an input" in err
    code, _, err = cli("grpo-step", data, "--model", "smollm2", "--ref", ckpt, "--out", ckpt)
    assert code == 2 and "is also an input" in err
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "config.json").write_text("{}")  # a checkpoint folder, that holds the data
    other = write_jsonl(tmp_path / "data" / "d.jsonl", ANSWERED)
    code, _, err = cli("sft", other, "--model", "smollm2", "--out", tmp_path / "data")
    assert code == 2 and "holds the input" in err and other.exists()


def test_run_all_resume_never_adopts_a_folder_it_did_not_make(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    (ckpt / "model.safetensors").write_bytes(b"weights")
    before = tree(ckpt)
    code, _, err = cli("run-all", "--demo", "--quick", "--resume", "--out", ckpt)
    assert code == 2 and "is not a run folder made by `atom run-all`" in err
    code, _, err = cli("run-all", "--demo", "--quick", "--out", ckpt)
    assert code == 2 and "not empty" in err and "--resume" not in err  # no hint that would adopt it
    assert tree(ckpt) == before


def test_output_guard_units(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    with pytest.raises(InputError, match="is a folder"):
        safety.check_output(d)
    with pytest.raises(InputError, match="cannot be `-`"):
        safety.check_output("-", safety.CHECKPOINT)
    safety.check_output("-")  # stdout is always fine for a file
    safety.check_output(tmp_path / "new.parquet", inputs=[tmp_path / "missing", "-", None, ""])
    (d / "x").write_text("x")
    with pytest.raises(InputError, match="not a demo-world folder"):
        safety.check_output(d, safety.DEMO_WORLD)
    (d / "corpus.jsonl").write_text("")
    safety.check_output(d, safety.DEMO_WORLD)  # a demo world may be rebuilt


# --- 2. resume that silently mixes runs --------------------------------------------------------------

class FakeRollout:
    """The rollout module's interface with no model: each sample answers its question's first gold."""
    validate = staticmethod(rollout.validate)
    group_ids = staticmethod(rollout.group_ids)
    crash_after: int | None = None

    @staticmethod
    def provenance_fields(cfg, ctx):
        return {"model": cfg.model, "tokenizer": "fake", "extra": {}}

    @classmethod
    def run(cls, table, cfg, ctx, *, done_groups=frozenset(), sink=None):
        gids = rollout.group_ids(table)
        groups = []
        for r in rollout.selected_rows(table, cfg):
            if gids[r] in done_groups:
                continue
            sub = table.take(pa.array([r] * cfg.group_size, type=pa.int64()))
            g = schema.set_columns(sub, {
                "traj_id": [f"{gids[r]}/{s}" for s in range(cfg.group_size)], "group_id": [gids[r]] * cfg.group_size,
                "sample_idx": list(range(cfg.group_size)), "policy": [cfg.model] * cfg.group_size,
                "answer": [f"{cfg.seed}:{cfg.temperature}"] * cfg.group_size})
            if sink is not None:
                sink(g)
            groups.append(g)
            if cls.crash_after is not None and len(groups) >= cls.crash_after:
                raise KeyboardInterrupt
        return pa.concat_tables(groups) if groups else table.slice(0, 0)


def _cfg(**kw):
    return rollout.RolloutConfig(model="fake-policy", search="ddg", group_size=2, **kw)


def _roll(questions, out, *, resume, **kw):
    return rollout_io.run_to_file(FakeRollout, questions, _cfg(**kw), Context(quiet=True), out=str(out), fmt=None,
                                  resume=resume)


def _questions(rows) -> pa.Table:
    return schema.conform(pa.Table.from_pylist(rows))


def test_resume_refuses_rows_for_questions_not_in_the_input(tmp_path):
    out = tmp_path / "r.parquet"
    _roll(_questions(QUESTIONS), out, resume=False)
    with pytest.raises(InputError, match="question `q2`, which is not in the question file"):
        _roll(_questions(QUESTIONS[:2]), out, resume=True)


def test_resume_refuses_a_colliding_id_from_another_question_file(tmp_path):
    """FlashRAG ids such as `test_0` repeat across benchmarks: the same id, another question."""
    out = tmp_path / "r.parquet"
    _roll(_questions(QUESTIONS), out, resume=False)
    other = [{**q, "question": q["question"].replace("born", "buried")} for q in QUESTIONS]
    with pytest.raises(InputError, match="question `q0` has another `question`"):
        _roll(_questions(other), out, resume=True)
    other = [{**q, "golden_answers": ["Rome"]} for q in QUESTIONS]
    with pytest.raises(InputError, match="another `golden_answers`"):
        _roll(_questions(other), out, resume=True)


@pytest.mark.parametrize("change, shown", [({"group_size": 4}, "group_size: 2 -> 4"), ({"seed": 7}, "seed: 0 -> 7"),
                                           ({"temperature": 0.7}, "temperature: 1.0 -> 0.7"),
                                           ({"max_turns": 3}, "max_turns: 10 -> 3")])
def test_resume_refuses_a_changed_config_naming_what_differs(tmp_path, change, shown):
    out = tmp_path / "r.parquet"
    _roll(_questions(QUESTIONS), out, resume=False)
    kw = {"group_size": 2, **change}
    cfg = rollout.RolloutConfig(model="fake-policy", search="ddg", **kw)
    with pytest.raises(InputError, match="other settings") as e:
        rollout_io.run_to_file(FakeRollout, _questions(QUESTIONS), cfg, Context(quiet=True), out=str(out), fmt=None,
                               resume=True)
    assert shown in str(e.value)


def test_resume_accepts_changes_that_do_not_change_a_trajectory(tmp_path):
    out = tmp_path / "r.parquet"
    _roll(_questions(QUESTIONS), out, resume=False)
    first = tableio.read_table(str(out)).column("traj_id").to_pylist()
    _roll(_questions(QUESTIONS), out, resume=True, batch_size=3, concurrency=2, timeout=5.0)
    assert tableio.read_table(str(out)).column("traj_id").to_pylist() == first


def test_resume_of_unfinished_groups_checks_their_config_too(tmp_path):
    out = tmp_path / "r.parquet"
    FakeRollout.crash_after = 1
    try:
        with pytest.raises(KeyboardInterrupt):
            _roll(_questions(QUESTIONS), out, resume=False)
    finally:
        FakeRollout.crash_after = None
    partial = rollout_io.partial_dir(str(out))
    assert len(list(partial.glob("*.parquet"))) == 1 and (partial / rollout_io.MARKER).exists()
    with pytest.raises(InputError, match="unfinished groups.*seed: 0 -> 5"):
        _roll(_questions(QUESTIONS), out, resume=True, seed=5)
    done = _roll(_questions(QUESTIONS), out, resume=True)
    assert done.num_rows == 6 and not partial.exists()


def test_refused_or_failed_rollouts_leave_no_empty_partial_folder(tmp_path):
    q = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    out = tmp_path / "r.parquet"
    code, _, err = cli("rollout", q, "--search", f"local:{tmp_path / 'missing.sqlite'}", "--out", out)
    assert code == 2 and "search index not found" in err
    assert not rollout_io.partial_dir(str(out)).exists() and not out.exists()

    class Failing(FakeRollout):
        @classmethod
        def run(cls, *a, **kw):
            raise InputError("refused before any group")
    with pytest.raises(InputError):
        rollout_io.run_to_file(Failing, _questions(QUESTIONS), _cfg(), Context(quiet=True), out=str(out), fmt=None,
                               resume=False)
    assert not rollout_io.partial_dir(str(out)).exists()


def test_a_partial_folder_with_foreign_files_is_never_deleted(tmp_path):
    out = tmp_path / "r.parquet"
    partial = rollout_io.partial_dir(str(out))
    partial.mkdir()
    (partial / "notes.txt").write_text("mine")
    for resume in (False, True):
        with pytest.raises(InputError, match="does not write"):
            _roll(_questions(QUESTIONS), out, resume=resume)
    assert (partial / "notes.txt").read_text() == "mine"


def _toml(path: Path, steps: int, train: Path) -> Path:
    path.write_text(f'[run-all]\ntrain = "{train}"\ntest = "{train}"\nsearch = "local:idx.sqlite"\nsteps = {steps}\n')
    return path


def test_run_all_resume_refuses_a_changed_config(tmp_path):
    train = tmp_path / "missing.jsonl"
    first, second = _toml(tmp_path / "a.toml", 2, train), _toml(tmp_path / "b.toml", 5, train)
    run = tmp_path / "run"
    settings = run_all.prepare(run, None, str(first), Context(quiet=True), build=False)
    run_all.folder.mark(run, settings)
    before = tree(run)
    code, _, err = cli("run-all", "--config", second, "--resume", "--out", run)
    assert code == 2 and "other settings" in err and "[run-all] steps: 2 -> 5" in err
    assert tree(run) == before  # config.json is not rewritten
    # the unchanged config gets past the check (and then stops at the missing question file)
    code, _, err = cli("run-all", "--config", first, "--resume", "--out", run)
    assert code == 2 and "file not found" in err


def test_run_all_resumes_a_run_folder_made_before_the_marker(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"run-all": {"steps": 1}}))
    assert safety.is_run_folder(run)
    (run / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not safety.is_run_folder(run)


# --- 3. deadlines that hold --------------------------------------------------------------------------

class TrickleServer:
    """A raw socket server that answers every connection one byte at a time, forever."""

    def __init__(self, mode: str):
        self.mode, self.connections = mode, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        head = {"status line": b"HTTP/1.1 200 OK\r\n" + b" " * 10000,
                "headers": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Slow: " + b"a" * 10000,
                "silent": b""}[self.mode]
        try:
            conn.recv(65536)
            if not head:
                self.stop.wait(30)
            for b in head:
                if self.stop.is_set():
                    break
                conn.sendall(bytes([b]))
                time.sleep(0.05)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


def _bounded(fn, seconds: float):
    """fn() in a thread; (result or exception, elapsed), or a failure if it outlives `seconds`."""
    box: list = []

    def go():
        t0 = time.monotonic()
        try:
            box.append((fn(), time.monotonic() - t0))
        except Exception as e:  # noqa: BLE001  (the exception is the result under test)
            box.append((e, time.monotonic() - t0))
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"still waiting after {seconds} s: the deadline did not hold"
    return box[0]


@pytest.mark.parametrize("mode", ["status line", "headers", "silent"])
def test_fetch_deadline_holds_while_status_line_and_headers_trickle(mode):
    server = TrickleServer(mode)
    try:
        fetcher = Fetcher("127.0.0.1", FetchLimits(connect_timeout=5, read_timeout=5, total_timeout=1))
        result, elapsed = _bounded(lambda: fetcher.get(f"http://127.0.0.1:{server.port}/"), 10)
    finally:
        server.close()
    assert isinstance(result, ToolFault) and "longer than 1 s" in str(result), result
    assert elapsed < 1.6


def test_a_browse_call_never_waits_past_the_deadline_retries_included():
    server = TrickleServer("headers")
    try:
        tb = ToolBox("", Context(quiet=True), allow_hosts="127.0.0.1", retry=RetryPolicy(attempts=4, base=0.01),
                     limits=FetchLimits(connect_timeout=5, read_timeout=5, total_timeout=1))
        call = parse_tool_call(json.dumps(
            {"name": "browse_webpage", "arguments": {"url_list": [f"http://127.0.0.1:{server.port}/p"], "query": "x"}}))
        result, elapsed = _bounded(lambda: tb.run(call), 15)
        tb.close()
    finally:
        server.close()
    assert not result.ok and "longer than 1 s" in result.error
    assert elapsed < 1.8, elapsed  # one deadline for the url, not one per attempt


def test_retry_never_sleeps_past_a_deadline():
    sleeps = []
    policy = RetryPolicy(attempts=5, base=10.0, cap=10.0, sleep=sleeps.append)

    def fail():
        raise ToolFault("down", retry_after=30)
    with pytest.raises(ToolFault):
        policy.call_by(time.monotonic() + 2, fail)
    assert sleeps == []


# --- 4. keys that travel -----------------------------------------------------------------------------

class Redirector:
    """POST /v1/... answers a redirect to `target`; POST /same/... answers a chat completion."""

    def __init__(self, code: int, target: str):
        self.code, self.target, self.requests = code, target, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                outer.requests.append((self.path, dict(self.headers), self.rfile.read(n)))
                if self.path.startswith("/same/"):
                    body = json.dumps({"choices": [{"message": {"content": "[1]"}}]}).encode()
                    self.send_response(200)
                else:
                    body = b"REDIRECT-BODY-MARKER"
                    self.send_response(outer.code)
                    self.send_header("Location", outer.target)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_the_judge_never_follows_a_redirect_to_another_host(monkeypatch, code):
    from atomcli.rewards.judges import JudgeError, make_openai
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-123")
    with FakeOpenAI({"error": "OTHER-HOST-BODY"}) as other:
        # the same machine under another name: another host as far as the key is concerned
        red = Redirector(code, f"http://localhost:{other.port}/v1/chat/completions")
        try:
            judge = make_openai(f"http://127.0.0.1:{red.port}/v1#m", Context(quiet=True), retries=1)
            (out,) = judge.complete(["x"])
        finally:
            red.close()
        assert other.requests == []  # nothing, and so no key, ever reached the other host
    assert isinstance(out, JudgeError) and "not followed" in str(out) and f"localhost:{other.port}" in str(out)
    assert "OTHER-HOST-BODY" not in str(out) and "REDIRECT-BODY-MARKER" not in str(out)
    assert "SECRET" not in str(out)


def test_a_same_server_307_is_followed_with_the_same_post():
    red = Redirector(307, "/same/v1/chat/completions")
    try:
        raw = openai_http.post_json(f"http://127.0.0.1:{red.port}/v1/chat/completions", b'{"a": 1}', key="sk-k",
                                    timeout=5, max_bytes=1 << 20, what="policy server", permanent_error=RuntimeError)
    finally:
        red.close()
    assert json.loads(raw)["choices"][0]["message"]["content"] == "[1]"
    assert [r[0] for r in red.requests] == ["/v1/chat/completions", "/same/v1/chat/completions"]
    assert red.requests[1][2] == b'{"a": 1}' and red.requests[1][1]["Authorization"] == "Bearer sk-k"


def test_the_policy_engine_helper_refuses_a_same_host_redirect_that_turns_post_into_get():
    red = Redirector(302, "/same/v1/completions")
    try:
        with pytest.raises(RuntimeError, match="turn the POST into a GET"):
            openai_http.post_json(f"http://127.0.0.1:{red.port}/v1/completions", b"{}", key="sk-k", timeout=5,
                                  max_bytes=1 << 20, what="policy server", permanent_error=RuntimeError)
    finally:
        red.close()
    assert len(red.requests) == 1


SECRET_SPECS = ["openai:https://user:sk-test-SECRET-123@api.example.com/v1#gpt",
                "openai:https://sk-test-SECRET-123@api.example.com/v1#gpt",
                "openai:https://api.example.com/v1?api_key=sk-test-SECRET-123#gpt",
                "openai:https://api.example.com/v1?key=sk-test-SECRET-123&x=1#gpt"]


@pytest.mark.parametrize("spec", SECRET_SPECS)
def test_a_key_inside_a_spec_is_never_stored_or_printed(tmp_path, spec):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    q = write_jsonl(tmp_path / "q.jsonl", QUESTIONS)
    for args in (["score-rrm", table, "--judge", spec, "--out", tmp_path / "s.parquet"],
                 ["eval", table, "--judge", spec, "--out", tmp_path / "r.json"],
                 ["rollout", q, "--model", spec, "--search", "ddg", "--out", tmp_path / "r.parquet"],
                 ["browse", "local://doc/x", "--reader", spec]):
        code, out, err = cli(*args)
        assert code == 2 and "SECRET" not in out + err and "carries" in err, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl", "t.jsonl"]
    toml = tmp_path / "c.toml"
    toml.write_text(f'[score-rrm]\njudge = "{spec}"\n')
    code, out, err = cli("score-rrm", table, "--config", toml, "--out", tmp_path / "s.parquet")
    assert code == 2 and "SECRET" not in out + err


def test_redaction_of_urls_in_any_message():
    msg = "cannot reach judge at https://u:sk-SECRET@h.example/v1/chat?token=sk-SECRET2&q=1: refused"
    assert "SECRET" not in safety.redact_secrets(msg)
    assert safety.redact_secrets("local:/tmp/idx.sqlite and http://localhost:8000/v1#Qwen") == \
        "local:/tmp/idx.sqlite and http://localhost:8000/v1#Qwen"
    assert safety.find_secret("openai:http://localhost:8000/v1#Qwen/Qwen3-30B-A3B") is None


# --- 5. terminal output from untrusted text ----------------------------------------------------------

def test_show_makes_control_characters_visible(tmp_path):
    row = {**ANSWERED[0], "question": f"Q {ESCAPES}", "answer": f"A {ESCAPES}",
           "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                        {"role": "assistant", "content": f"<think>{ESCAPES}</think><answer>x{ESCAPES}</answer>"},
                        {"role": "tool", "content": f"page {ESCAPES}"}]}
    table = write_jsonl(tmp_path / "t.jsonl", [row])
    code, out, err = cli("show", table)
    assert code == 0, err
    assert not any(c in out for c in RAW) and "\\x1b]52;c;" in out and "\\u202e" in out and "\\x9b" in out


def test_search_and_browse_make_control_characters_visible(corpus_index):
    _, index = corpus_index
    code, out, _ = cli("search", "Zorbl river", "--index", index)
    assert code == 0 and not any(c in out for c in RAW) and "\\x1b[2J" in out
    code, out, _ = cli("search", "Zorbl river", "--index", index, "--format", "json")
    assert code == 0 and not any(c in out for c in RAW)
    rows = [json.loads(line) for line in out.splitlines()]  # still valid JSON (one object per result), same text
    assert any(ESCAPES in r["title"] + r["snippet"] for r in rows)
    url = search_local.LOCAL_PREFIX + "d1"
    for fmt in ("text", "json"):
        code, out, err = cli("browse", url, "--query", "Zorbl river", "--search", f"local:{index}", "--format", fmt)
        assert code == 0, err
        assert "Zorbl" in out and not any(c in out for c in RAW)


def test_visible_keeps_text_and_newlines():
    assert safety.visible("a\tb\nc — ünïcode") == "a\tb\nc — ünïcode"
    assert safety.visible("\x1b[31mred\x1b[0m\r") == "\\x1b[31mred\\x1b[0m\\x0d"
    assert json.loads(safety.visible_json(json.dumps("x\x9b\u202e", ensure_ascii=False))) == "x\x9b\u202e"


# --- 6. files that are not ours ----------------------------------------------------------------------

def test_cache_refuses_the_search_index_before_any_write(tmp_path, corpus_index):
    _, index = corpus_index
    before = digest(index)
    code, out, err = cli("search", "Zorbl", "--index", index, "--cache", index)
    assert code == 2 and "is not an atomcli tool cache" in err and "docs" in err
    assert digest(index) == before
    assert not Path(f"{index}-wal").exists() and not Path(f"{index}-shm").exists()
    with sqlite3.connect(index) as con:  # still an index, in its own journal mode
        assert con.execute("PRAGMA journal_mode").fetchone()[0] != "wal"


def test_cache_refuses_other_files_and_accepts_its_own(tmp_path, corpus_index):
    _, index = corpus_index
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    before = digest(table)
    code, _, err = cli("search", "Zorbl", "--index", index, "--cache", table)
    assert code == 2 and "not a SQLite file" in err and digest(table) == before
    cache = tmp_path / "c.sqlite"
    assert cli("search", "Zorbl", "--index", index, "--cache", cache)[0] == 0
    code, out, _ = cli("search", "Zorbl", "--index", index, "--cache", cache, "--format", "json")
    assert code == 0 and out and all(json.loads(line)["cached"] is True for line in out.splitlines())
    (tmp_path / "empty.sqlite").write_bytes(b"")
    Cache(str(tmp_path / "empty.sqlite")).close()  # an empty file is a new cache


# --- 7. checks that come late or not at all ------------------------------------------------------------

def test_a_misspelled_section_is_an_error_listing_the_valid_ones(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    toml = tmp_path / "c.toml"
    toml.write_text("[score_rrm]\njudge = \"heuristic\"\n[rolout]\ngroup_size = 2\n")
    code, _, err = cli("score-rrm", table, "--config", toml, "--out", tmp_path / "s.parquet")
    assert code == 2 and "unknown section `[rolout]`" in err and "[rollout]" in err
    assert not (tmp_path / "s.parquet").exists()


def test_true_is_not_an_integer():
    with pytest.raises(InputError, match="must be int, got True"):
        config.build(rollout.RolloutConfig, {"group_size": True})
    with pytest.raises(InputError, match="must be float"):
        config.build(rollout.RolloutConfig, {"temperature": False})
    assert config.build(rollout.RolloutConfig, {"replay": True}).replay is True


@pytest.mark.parametrize("bad", ['[rollout]\ngroup_size = 0\n', '[rolout]\ngroup_size = 2\n',
                                 '[run-all]\nsteps = true\n', '[grpo-step]\nmicro_batch = 0\n'])
def test_run_all_checks_its_config_before_building_the_demo_world(tmp_path, bad):
    toml = tmp_path / "c.toml"
    toml.write_text(bad)
    run = tmp_path / "run"
    t0 = time.monotonic()
    code, _, err = cli("run-all", "--demo", "--quick", "--config", toml, "--out", run)
    assert code == 2, err
    assert not run.exists()  # so the corrected command runs without --resume
    assert time.monotonic() - t0 < 20  # refused before any world was built


def test_an_out_that_is_a_folder_fails_before_the_stage_runs(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", ANSWERED)
    d = tmp_path / "d"
    d.mkdir()
    for args in (["score-rrm", table, "--judge", "openai:http://127.0.0.1:9/v1#m", "--out", d],
                 ["eval", table, "--out", d], ["show", table, "--html", d], ["index", table, "--out", d]):
        t0 = time.monotonic()
        code, _, err = cli(*args)
        assert code == 2 and "is a folder" in err, (args, err)
        assert time.monotonic() - t0 < 5
    assert list(d.iterdir()) == []


def _warnings(fn) -> str:
    buf = io.StringIO()
    fn(Context(console=Console(file=buf, width=300)))
    return buf.getvalue()


def test_empty_or_null_golden_answers_get_a_warning_not_a_silent_zero(tmp_path):
    rows = [{"id": "a", "question": "?", "golden_answers": ["x"]}, {"id": "b", "question": "?", "golden_answers": []},
            {"id": "c", "question": "?", "golden_answers": [None, " "]}]
    assert schema.missing_golden(_questions(rows)) == [1, 2]
    log = _warnings(lambda ctx: rollout_io.run_to_file(FakeRollout, _questions(rows), _cfg(), ctx,
                                                       out=str(tmp_path / "r.parquet"), fmt=None, resume=False))
    assert "2 row(s) have no golden answer" in log and "first: row 1" in log
    scored = tableio.read_table(str(tmp_path / "r.parquet"))
    scored = schema.set_columns(scored, {"messages": [[{"role": "assistant", "content": "x"}]] * scored.num_rows,
                                         "format_ok": [True] * scored.num_rows})
    log = _warnings(lambda ctx: aggregate_reward.run(scored, aggregate_reward.AggregateConfig(process="none"), ctx))
    assert "aggregate-reward: 4 row(s) have no golden answer" in log
    # eval refuses them outright; a blank string would otherwise match any answer under cover-EM
    blank = write_jsonl(tmp_path / "blank.jsonl", [{**ANSWERED[0], "golden_answers": [""]}])
    code, _, err = cli("eval", blank, "--out", tmp_path / "e.json")
    assert code == 2 and "empty `golden_answers`" in err
