"""Reliability (docs/RELIABILITY.md, "Outputs, comparisons, secrets and turn credit"): one test group per class.

Outputs that are not regular files, keys inside a policy-sync command, terminal escapes from table
text, turn credit that checks its inputs, checks before the work, files other processes need, and
messages. Each test fails on the code before the fix. No model is trained: the tiny model only
appears where a checkpoint is saved.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import stat
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import atom
from typer.testing import CliRunner

from atomcli import safety, schema, tableio
from atomcli.cli import app
from atomcli.context import Context
from atomcli.errors import InputError

ESCAPES = "\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b]0;title\x07\u202eevil\x9b31m"
RAW = ("\x1b", "\x07", "\u202e", "\x9b")
KEY = "sk-proj-abcdefghijklmnopqrstuvwxyz0123"


def cli(*args, input: bytes | str | None = None):
    res = CliRunner().invoke(app, [str(a) for a in args], input=input)
    return res.exit_code, res.stdout, res.stderr


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    """Rows as Parquet (JSON has no NaN), with the contract's column types."""
    cols = {k: [r.get(k) for r in rows] for k in rows[0]}
    tableio.write_table(pa.table({k: schema.array(k, v) if k in schema.COLUMNS else pa.array(v)
                                  for k, v in cols.items()}), str(path))
    return path


def scored_rows(n: int = 4) -> list[dict]:
    """Rows aggregate-reward takes with --process atr --credit turn: two turns each (two runs of 1s)."""
    rows = []
    for i in range(n):
        rows.append({
            "id": f"q{i // 2}", "traj_id": f"q{i // 2}/{i % 2}", "group_id": f"q{i // 2}",
            "question": "Where?", "golden_answers": ["Paris"],
            "messages": [{"role": "user", "content": "Where?"},
                         {"role": "assistant", "content": "<think>a</think><tool_call>{}</tool_call>"},
                         {"role": "tool", "content": "x"},
                         {"role": "assistant", "content": "<think>b</think><answer>Paris</answer>"}],
            "answer": "Paris" if i % 2 else "Lyon", "format_ok": True, "n_turns": 2,
            "loss_mask": [1, 1, 0, 0, 1, 1],
            "atomic_thoughts": [{"turn": 0, "tag": "think", "text": "a", "score": 6.0 + i},
                                {"turn": 1, "tag": "think", "text": "b", "score": 4.0}],
            "atr": 0.5, "rrm_error": None})
    return rows


def no_debris(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".old-" in p.name or p.name.endswith(".tmp"))


# --- 1. outputs that are not regular files ---------------------------------------------------------

def test_output_target_decides_per_kind_of_path(tmp_path):
    assert safety.output_target("/dev/null").how == safety.THROUGH
    assert safety.output_target("/dev/stdout").how == safety.THROUGH
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    t = safety.output_target(tmp_path / "link")
    assert t.how == safety.REPLACE and t.path == (tmp_path / "f").resolve()
    (tmp_path / "dangling").symlink_to(tmp_path / "new.parquet")
    assert safety.output_target(tmp_path / "dangling") == safety.Target(safety.NEW, (tmp_path / "new.parquet").resolve())
    with pytest.raises(InputError, match="is a folder"):
        safety.output_target(tmp_path)
    with pytest.raises(InputError, match="not a folder"):
        safety.output_target(tmp_path / "f", folder=True)
    with pytest.raises(InputError, match="must be a regular file"):
        safety.output_target("/dev/null", stream=False)
    blocks = [p for p in Path("/dev").glob("loop*") if p.exists() and stat.S_ISBLK(p.stat().st_mode)]
    if blocks:
        with pytest.raises(InputError, match="block device"):
            safety.output_target(blocks[0])


def test_an_output_through_a_link_to_a_device_keeps_the_link_and_the_device(tmp_path):
    link = tmp_path / "null.parquet"
    link.symlink_to("/dev/null")
    tableio.write_table(pa.table({"a": [1, 2]}), str(link))
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert no_debris(tmp_path) == []


def test_a_fifo_output_is_written_through_not_replaced(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    got = {}

    def read():
        with open(fifo, "rb") as f:
            got["data"] = f.read()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code, _, err = cli("aggregate-reward", table, "--out", fifo, "--format", "jsonl")
    reader.join(10)
    if reader.is_alive():  # nothing opened the FIFO for writing: unblock the reader before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert len(got["data"].splitlines()) == 4
    assert no_debris(tmp_path) == []


def test_an_output_linked_to_stdout_writes_to_stdout(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    link = tmp_path / "out.jsonl"
    link.symlink_to("/proc/self/fd/1")
    proc = atom("aggregate-reward", table, "--out", link, "--format", "jsonl", timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert link.is_symlink(), "the link to stdout was replaced by a regular file"
    assert [json.loads(x)["traj_id"] for x in proc.stdout.splitlines()] == ["q0/0", "q0/1", "q1/0", "q1/1"]


def test_a_symlink_to_a_file_keeps_pointing_at_the_new_content(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    target = tmp_path / "runs" / "r1.jsonl"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "latest.jsonl"
    link.symlink_to(target)
    code, _, err = cli("aggregate-reward", table, "--out", link)
    assert code == 0, err
    assert link.is_symlink() and len(target.read_text().splitlines()) == 4
    assert no_debris(tmp_path) == [] and no_debris(target.parent) == []


def test_a_folder_output_through_a_symlink_replaces_the_folder_not_the_link(tmp_path):
    real = tmp_path / "ckpts" / "step1"
    real.mkdir(parents=True)
    (real / "atom_state.json").write_text("{}")
    link = tmp_path / "latest"
    link.symlink_to(real)
    with tableio.atomic_dir(link) as tmp:
        (tmp / "atom_state.json").write_text('{"new": 1}')
    assert link.is_symlink() and json.loads((real / "atom_state.json").read_text()) == {"new": 1}
    assert no_debris(tmp_path) == [] and no_debris(real.parent) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        with tableio.atomic_dir(tmp_path / "file"):
            pass
    assert (tmp_path / "file").read_text() == "x"


def test_a_rollout_to_a_device_keeps_no_partial_folder_and_refuses_resume(tmp_path):
    from test_hardening_classes import QUESTIONS, _questions, _roll
    link = tmp_path / "null.parquet"
    link.symlink_to("/dev/null")
    _roll(_questions(QUESTIONS), link, resume=False)
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["null.parquet"]
    with pytest.raises(InputError, match="--resume needs --out to be a file"):
        _roll(_questions(QUESTIONS), link, resume=True)


def test_an_index_through_a_symlink_replaces_the_target_and_a_device_is_refused(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "d1", "title": "T", "contents": "The river flows."}])
    real = tmp_path / "indexes" / "v1.sqlite"
    real.parent.mkdir()
    link = tmp_path / "idx.sqlite"
    link.symlink_to(real)
    assert cli("index", corpus, "--out", link)[0] == 0
    assert link.is_symlink() and safety.is_index_file(real)
    null = tmp_path / "null.sqlite"
    null.symlink_to("/dev/null")
    code, _, err = cli("index", corpus, "--out", null)
    assert code == 2 and "must be a regular file" in err and null.is_symlink()


def test_a_socket_a_folder_link_and_a_device_for_a_run_folder_are_refused(tmp_path):
    import socket
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        code, _, err = cli("aggregate-reward", table, "--out", tmp_path / "sock")
        assert code == 2 and "is a socket" in err
    finally:
        sock.close()
    (tmp_path / "d").mkdir()
    (tmp_path / "dl").symlink_to(tmp_path / "d")
    code, _, err = cli("aggregate-reward", table, "--out", tmp_path / "dl")
    assert code == 2 and "is a folder" in err
    (tmp_path / "null").symlink_to("/dev/null")
    code, _, err = cli("run-all", "--out", tmp_path / "null")
    assert code == 2 and "exists and is not a folder" in err and (tmp_path / "null").is_symlink()


# --- 3. keys inside a policy-sync command ---------------------------------------------------------

@pytest.mark.parametrize("spec", [
    f'command:sync.sh -H "Authorization: Bearer {KEY}"',
    f"command:sync.sh --api-key {KEY}",
    "command:sync.sh --token=hunter2hunter2",
    f"command:env OPENAI_API_KEY={KEY} sync.sh",
    f"command:sync.sh {KEY}",
])
def test_a_key_inside_a_policy_sync_command_is_refused_and_never_printed(tmp_path, spec):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q0", "question": "Where?", "golden_answers": ["Paris"]}])
    code, out, err = cli("rollout", q, "--model", "openai:http://127.0.0.1:9/v1#m", "--policy-sync", spec,
                         "--out", tmp_path / "o.parquet")
    assert code == 2 and "policy_sync" in err and "refused" in err
    secret = "hunter2hunter2" if "hunter2" in spec else KEY
    assert secret not in err and secret not in out
    assert not (tmp_path / "o.parquet").exists()


def test_run_all_refuses_a_key_in_policy_sync_before_writing_config_json(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[run-all]\nmodel = "openai:http://127.0.0.1:9/v1#m"\n'
                   f"policy_sync = \"command:sync.sh -H 'Authorization: Bearer {KEY}'\"\n")
    code, _, err = cli("run-all", "--config", cfg, "--out", tmp_path / "run")
    assert code == 2 and "bearer token" in err and KEY not in err
    assert not (tmp_path / "run").exists()


def test_a_key_in_search_options_is_refused_like_one_in_a_spec(tmp_path):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q0", "question": "Where?", "golden_answers": ["Paris"]}])
    code, out, err = cli("rollout", q, "--search-options", "region=us,api_key=XYZabc12345", "--out", tmp_path / "o")
    assert code == 2 and "search_options" in err and "XYZabc12345" not in err + out


def test_policy_sync_refuses_a_key_where_the_spec_enters():
    from atomcli.engines import policy_sync
    with pytest.raises(InputError, match="carries a bearer token"):
        policy_sync.check_spec(f"command:curl -H 'Authorization: Bearer {KEY}'")
    policy_sync.check_spec('command:sh -c "curl -H \\"Authorization: Bearer $KEY\\""')  # a reference: fine


def test_bare_secrets_are_found_and_masked_and_ordinary_settings_are_not():
    for text in (f"Bearer {KEY}", f"--password {KEY}", "x-api-key: abcdefghij", "hf_" + "a" * 30,
                 "ghp_" + "b" * 36, "AKIA" + "C" * 16):
        assert safety.find_secret(text), text
        assert "***" in safety.redact_secrets(text) and text.split()[-1][-8:] not in safety.redact_secrets(text)
    for text in ("HuggingFaceTB/SmolLM2-135M-Instruct", "command:/opt/sync.sh", "--max-tokens 100", "lora-vllm",
                 "Basic research question", "task-specific-finetune-v2", "command:sync.sh --token $TOKEN"):
        assert safety.find_secret(text) is None, text
    with pytest.raises(InputError, match=r"setting `run-all.policy_sync`"):
        safety.check_no_secrets({"run-all": {"policy_sync": f"command:s --api-key {KEY}", "steps": 2}})


# --- 4. terminal escapes from table text ----------------------------------------------------------

def test_show_html_to_stdout_carries_no_raw_control_characters(tmp_path):
    rows = scored_rows(2)
    rows[0]["question"] = "Where " + ESCAPES
    rows[0]["data_source"] = "nq" + ESCAPES
    rows[0]["messages"][1]["content"] = "<think>" + ESCAPES + "</think><answer>x</answer>"
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    code, out, err = cli("show", table, "--html", "-")
    assert code == 0, err
    assert not any(c in out for c in RAW), "raw escape sequences in the page"
    assert "\\x1b]52;c;" in out and "\\u202e" in out  # shown, not dropped
    html_file = tmp_path / "p.html"
    assert cli("show", table, "--html", html_file)[0] == 0
    assert not any(c in html_file.read_text() for c in RAW)


def test_jsonl_on_stdout_writes_c1_controls_and_bidi_marks_as_json_escapes(tmp_path):
    rows = scored_rows(2)
    rows[0]["question"] = "Where " + ESCAPES
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    code, out, err = cli("aggregate-reward", table, "--out", "-", "--format", "jsonl")
    assert code == 0, err
    assert not any(c in out for c in RAW)
    assert json.loads(out.splitlines()[0])["question"] == "Where " + ESCAPES  # the same data


def test_the_context_console_shows_control_characters_in_tables_and_text():
    from rich.table import Table
    from rich.text import Text
    ctx = Context()
    buf = io.StringIO()
    ctx.console.file = buf
    t = Table(title="eval")
    t.add_column("data_source")
    t.add_row("nq" + ESCAPES)
    ctx.console.print(t)
    ctx.console.print(Text.assemble(("source: ", "bold"), ESCAPES))
    ctx.console.print("[bold]plain[/] " + ESCAPES)
    out = buf.getvalue()
    assert not any(c in out for c in RAW)
    assert out.count("\\x1b]52;c;") == 3 and "plain" in out and "[bold]" not in out


# --- 5. turn credit checks its inputs -------------------------------------------------------------

@pytest.mark.parametrize("bad, match", [
    ({"score": float("nan")}, "holds nan on turn 0"),
    ({"score": 250.0}, r"holds 250.0 on turn 0, expected a number in \[0, 10\]"),
    ({"score": -1.0}, "holds -1.0"),
    ({"turn": 2}, "has a value on turn 2, but the row has 2 assistant turns"),
    ({"turn": -1}, "turn -1"),
    ({"turn": None}, "turn None"),
])
def test_turn_credit_refuses_bad_thought_scores_naming_row_and_column(tmp_path, bad, match):
    rows = scored_rows()
    rows[3]["atomic_thoughts"][0].update(bad)
    table = write_parquet(tmp_path / "t.parquet", rows)
    code, _, err = cli("aggregate-reward", table, "--process", "atr", "--credit", "turn", "--out",
                       tmp_path / "o.parquet")
    assert code == 2, err
    assert f"{table}, row 3, column `atomic_thoughts`" in err and re.search(match, err)
    assert not (tmp_path / "o.parquet").exists()


def test_turn_credit_still_accepts_good_and_unscored_rows(tmp_path):
    rows = scored_rows()
    rows[1]["atr"], rows[1]["rrm_error"] = None, "judge failed"
    for th in rows[1]["atomic_thoughts"]:
        th["score"] = None
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    code, _, err = cli("aggregate-reward", table, "--process", "atr", "--credit", "turn", "--out",
                       tmp_path / "o.parquet")
    assert code == 0, err
    adv = tableio.read_table(str(tmp_path / "o.parquet")).column("turn_advantages").to_pylist()
    assert all(len(a) == 2 and all(math.isfinite(x) for x in a) for a in adv)


def test_ig_turn_credit_goes_through_the_same_check():
    from atomcli.stages import aggregate_reward as agg
    with pytest.raises(InputError, match="`turn_ig` has 1 values but the row has 2") as e:
        agg.check_turn_signal("ig", [[(0, 0.1), (1, 0.2)], [(0, 0.1)]], [2, 2], [True, True])
    assert e.value.row == 1 and e.value.column == "turn_ig"
    with pytest.raises(InputError, match="expected a finite number"):
        agg.check_turn_signal("ig", [[(0, float("inf"))]], [1], [False])


# --- 6. checks before the work: an --out that cannot be written -----------------------------------

@pytest.mark.parametrize("stage", ["sft", "grpo-step"])
def test_training_stages_refuse_an_unwritable_out_before_loading_a_model(tmp_path, stage):
    data = write_jsonl(tmp_path / "d.jsonl", scored_rows())
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    t0 = time.time()
    code, _, err = cli(stage, data, "--model", tmp_path / "no-such-model", "--out", blocker / "ckpt")
    assert code == 2 and "cannot be made" in err and "file.txt is not a folder" in err, err
    assert time.time() - t0 < 20


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_out_in_a_read_only_folder_is_refused_before_the_work(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    code, _, err = cli("aggregate-reward", table, "--out", ro / "o.parquet")
    assert code == 2 and "not writable" in err


def test_check_writable_names_the_folder_that_blocks(tmp_path):
    with pytest.raises(InputError, match="/proc/version is not a folder"):
        safety.check_writable(safety.Target(safety.NEW, Path("/proc/version/x/out.parquet")))
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    for out in ("/proc/out.parquet", "/proc/self/new/out.parquet"):  # root may write anywhere else
        code, _, err = cli("aggregate-reward", table, "--out", out)
        assert code == 2 and "is not writable" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]  # the probe leaves nothing


# --- 7. files other processes need -------------------------------------------------------------------

def test_atomic_dir_gives_every_file_the_umask_mode(tmp_path):
    with tableio.atomic_dir(tmp_path / "ck") as tmp:
        secret = tmp / "model.safetensors"
        secret.write_bytes(b"x")
        secret.chmod(0o600)  # what a library's own temporary file gets
        (tmp / "sub").mkdir(mode=0o700)
        (tmp / "sub" / "w.bin").write_bytes(b"y")
        (tmp / "sub" / "w.bin").chmod(0o600)
        (tmp / "run.sh").write_text("#!/bin/sh\n")
        (tmp / "run.sh").chmod(0o700)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    ck = tmp_path / "ck"
    assert mode(ck / "model.safetensors") == tableio.default_mode(0o666)
    assert mode(ck / "sub" / "w.bin") == tableio.default_mode(0o666)
    assert mode(ck / "sub") == tableio.default_mode(0o777) == mode(ck)
    assert mode(ck / "run.sh") == tableio.default_mode(0o777)


def test_checkpoint_weights_get_the_mode_of_every_other_file(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from atomcli import checkpoint
    result = checkpoint.TrainResult(model=AutoModelForCausalLM.from_pretrained(tiny_model),
                                    tokenizer=AutoTokenizer.from_pretrained(tiny_model), step=1, metrics={},
                                    base=str(tiny_model))
    checkpoint.save(result, str(tmp_path / "ck"), stage="grpo-step")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "ck").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"] == tableio.default_mode(0o666), modes


def _ingredient(folder: Path, value: float) -> Path:
    import torch
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    save_file({"w": torch.full((2, 2), value)}, str(folder / "model.safetensors"))
    (folder / "model.safetensors").chmod(0o600)
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_a_soup_is_written_atomically_with_shared_modes(tmp_path):
    from safetensors.torch import load_file

    from atomcli.train import soup
    a, b = _ingredient(tmp_path / "a", 1.0), _ingredient(tmp_path / "b", 3.0)
    soup.average([str(a), str(b)], str(tmp_path / "soup"))
    assert load_file(str(tmp_path / "soup" / "model.safetensors"))["w"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
    assert stat.S_IMODE((tmp_path / "soup" / "model.safetensors").stat().st_mode) == tableio.default_mode(0o666)
    assert no_debris(tmp_path) == []


# --- 8. messages ------------------------------------------------------------------------------------

def test_a_truncated_soup_ingredient_is_named(tmp_path):
    from atomcli.train import soup
    a, b = _ingredient(tmp_path / "a", 1.0), _ingredient(tmp_path / "b", 3.0)
    data = (b / "model.safetensors").read_bytes()
    (b / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="not a readable safetensors file") as e:
        soup.average([str(a), str(b)], str(tmp_path / "soup"))
    assert e.value.file == str(b / "model.safetensors")
    assert not (tmp_path / "soup").exists()


def test_a_config_that_is_a_folder_exits_2(tmp_path):
    table = write_jsonl(tmp_path / "t.jsonl", scored_rows())
    code, _, err = cli("aggregate-reward", table, "--config", tmp_path, "--out", tmp_path / "o.parquet")
    assert code == 2 and "is a folder, expected a TOML config file" in err


def test_a_jsonl_with_a_byte_order_mark_reads(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + b"".join(json.dumps(r).encode() + b"\n" for r in scored_rows()))
    assert tableio.read_table(str(p)).num_rows == 4
    p16 = tmp_path / "u16.jsonl"
    p16.write_bytes(json.dumps(scored_rows(1)[0]).encode("utf-16"))
    with pytest.raises(InputError, match="UTF-16") as e:
        tableio.read_table(str(p16))
    assert "Parquet" not in str(e.value)


def test_a_broken_line_after_blank_lines_names_its_table_row(tmp_path):
    rows = [json.dumps(r) for r in scored_rows(3)]
    p = tmp_path / "t.jsonl"
    p.write_text(rows[0] + "\n\n\n" + rows[1] + "\n\n" + '{"id": "cut' + "\n" + rows[2] + "\n")
    with pytest.raises(InputError) as e:
        tableio.read_table(str(p))
    assert e.value.row == 2 and "line 6 is not valid JSON" in str(e.value)
    assert "Parquet" not in str(e.value)


def test_rft_on_rows_without_golden_answers_names_the_cause(tmp_path):
    rows = scored_rows()
    for r in rows:
        r.update(golden_answers=[], finish_reason="answer")
    table = write_jsonl(tmp_path / "t.jsonl", rows)
    code, _, err = cli("rft", table, "--out", tmp_path / "o.parquet")
    assert code == 2 and "column `golden_answers`" in err and "no row has a golden answer" in err
    assert "answered right" not in err


def test_a_partial_folder_that_is_a_symlink_exits_2(tmp_path):
    q = write_jsonl(tmp_path / "q.jsonl", [{"id": "q0", "question": "Where?", "golden_answers": ["Paris"]}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / ".o.parquet.partial").symlink_to(elsewhere)
    for extra in ([], ["--resume"]):
        code, _, err = cli("rollout", q, "--out", tmp_path / "o.parquet", *extra)
        assert code == 2 and ".o.parquet.partial" in err and "symbolic link" in err, err
    assert elsewhere.is_dir() and (tmp_path / ".o.parquet.partial").is_symlink()
