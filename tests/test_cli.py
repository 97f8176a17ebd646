"""The foundation: CLI surface, error boundary, schema contract, table I/O, config precedence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from conftest import ROOT, atom

from atomcli import config, progress, schema, tableio
from atomcli.errors import InputError

COMMANDS = ["sft", "rollout", "score-rrm", "aggregate-reward", "rft", "grpo-step", "eval", "run-all", "index", "search"]


def test_help_lists_commands_without_heavy_imports():
    code = ("import sys, time; t=time.time(); from atomcli.cli import app; from typer.testing import CliRunner; "
            "r=CliRunner().invoke(app, ['--help']); "
            "print(r.output); print('HEAVY', [m for m in ('torch','transformers','trl') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    for name in COMMANDS:
        assert name in out
    assert "HEAVY []" in out


def test_help_is_fast():
    best = min(_timed(["--help"]) for _ in range(3))
    assert best < 1.5, f"atom --help took {best:.2f}s"  # generous: the benchmark measures it precisely


def _timed(args):
    t = time.perf_counter()
    atom(*args, check=True)
    return time.perf_counter() - t


def test_version_is_written_once():
    import tomllib
    p = atom("--version", check=True)
    assert p.stdout.decode() == "atomcli 0.2.0\n"
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"] and "version" not in meta["project"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "atomcli.__version__"}


@pytest.mark.parametrize("debug", ["", "1"])
def test_library_bars_and_warnings_are_off_unless_debugging(debug):
    """Every command quiets transformers/datasets/huggingface_hub and Python warnings; ATOM_DEBUG=1 keeps them."""
    code = ("import os, warnings; from typer.testing import CliRunner; from atomcli.cli import app; "
            "r = CliRunner().invoke(app, ['sft', 'missing.jsonl', '--out', 'x']); "
            "assert r.exit_code in (1, 2), r.output; "
            "warnings.warn('a library speaks', FutureWarning); "
            "print('BARS', os.environ.get('HF_HUB_DISABLE_PROGRESS_BARS'), os.environ.get('TRANSFORMERS_VERBOSITY'))")
    env = {k: v for k, v in os.environ.items() if k not in progress.QUIET_ENV} | {"ATOM_DEBUG": debug}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    if debug:
        assert "BARS None None" in p.stdout and "FutureWarning: a library speaks" in p.stderr
    else:
        assert "BARS 1 error" in p.stdout and "Warning" not in p.stderr


def test_missing_column_names_the_stage_and_writes_nothing():
    p = atom("aggregate-reward", "-", "--out", "-", "--step", "0", "--total-steps", "10",
             input='{"id":"q1","question":"x","golden_answers":["y"]}\n')
    assert p.returncode == 2
    assert p.stdout == b""
    err = p.stderr.decode()
    assert "missing" in err and "atom rollout" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_jsonl_line_is_located(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"id":"a","question":"x","golden_answers":["y"]}\n{oops\n')
    out = tmp_path / "o.parquet"
    p = atom("rollout", f, "--out", out, "--search", "local:nowhere")
    assert p.returncode == 2
    assert "line 2" in p.stderr.decode() and str(f) in p.stderr.decode()
    assert not out.exists()


def test_unknown_search_backend_lists_valid_names(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"id":"a","question":"x","golden_answers":["y"]}\n')
    p = atom("rollout", f, "--out", tmp_path / "o.parquet", "--search", "bing")
    assert p.returncode == 2
    assert "valid:" in p.stderr.decode() and "local" in p.stderr.decode()


def test_debug_shows_traceback():
    p = atom("--debug", "aggregate-reward", "-", "--out", "-", "--step", "0", "--total-steps", "1",
             input='{"id":"q1"}\n')
    assert p.returncode != 0 and b"Traceback" in p.stderr


def _sample_table() -> pa.Table:
    rows = [{"id": "q1", "question": "Who?", "golden_answers": ["A", "B"], "extra": {"k": [1, 2]},
             "messages": [{"role": "user", "content": "hi"}], "loss_mask": [0, 1, 1],
             "old_logprobs": [0.0, -1.5, -0.25], "atr": None, "note": "ünï"},
            {"id": "q2", "question": "Où?", "golden_answers": [], "extra": None,
             "messages": [], "loss_mask": [], "old_logprobs": [], "atr": 0.5, "note": None}]
    cols = {k: [r[k] for r in rows] for k in rows[0]}
    return schema.set_columns(pa.table({"id": cols.pop("id")}), cols)


def test_jsonl_parquet_jsonl_round_trip(tmp_path):
    t = _sample_table()
    tableio.write_table(t, str(tmp_path / "a.jsonl"))
    t1 = tableio.read_table(str(tmp_path / "a.jsonl"))
    tableio.write_table(t1, str(tmp_path / "b.parquet"))
    t2 = tableio.read_table(str(tmp_path / "b.parquet"))
    tableio.write_table(t2, str(tmp_path / "c.jsonl"))
    assert t2.column_names == t.column_names
    assert t2.to_pylist() == t.to_pylist()
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "a.jsonl").read_bytes()
    assert t2.schema.field("loss_mask").type == pa.list_(pa.int8())


def test_stdin_parquet_is_buffered(tmp_path):
    data = tableio.table_bytes(_sample_table(), "parquet")
    assert tableio.read_table("-", data=data).num_rows == 2


def test_unknown_columns_pass_through_and_provenance_appends():
    t = schema.with_provenance(_sample_table(), "rollout", {"k": 1, "api_key": "sk-secret"}, tokenizer="tok")
    t = schema.set_columns(t, {"f1": [1.0, 0.0]})
    t = schema.with_provenance(t, "aggregate-reward", {"step": 0})
    assert [r["stage"] for r in schema.provenance(t)] == ["rollout", "aggregate-reward"]
    assert "sk-secret" not in json.dumps(schema.provenance(t))
    assert schema.token_source(t)["tokenizer"] == "tok"
    assert t.column("extra").to_pylist() == [{"k": [1, 2]}, None]


def test_require_reports_missing_and_wrong_type():
    t = pa.table({"id": ["a"], "question": ["q"], "golden_answers": [["x"]]})
    with pytest.raises(InputError, match="run `atom score-rrm` first"):
        schema.require(t, "aggregate-reward", "f.parquet", ["atr"])
    bad = pa.table({"id": ["a"], "question": ["q"], "golden_answers": ["not a list"]})
    with pytest.raises(InputError, match="golden_answers"):
        schema.require(bad, "rollout", "f")


def test_wrong_type_in_jsonl_names_row_and_column(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"id":"a","loss_mask":[1,0]}\n{"id":"b","loss_mask":"oops"}\n')
    with pytest.raises(InputError) as e:
        tableio.read_table(str(f))
    assert e.value.row == 1 and e.value.column == "loss_mask"


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    out = tmp_path / "t.parquet"
    tableio.write_table(_sample_table(), str(out))
    before = out.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(tableio.os, "replace", boom)
    with pytest.raises(OSError):
        tableio.write_table(_sample_table().slice(0, 1), str(out))
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_atomic_dir_keeps_previous_on_error(tmp_path):
    target = tmp_path / "ckpt"
    with tableio.atomic_dir(target) as d:
        (d / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with tableio.atomic_dir(target) as d:
            (d / "a").write_text("2")
            raise RuntimeError
    assert (target / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_config_precedence_default_file_flags(tmp_path):
    from atomcli.stages.rollout import RolloutConfig
    f = tmp_path / "c.toml"
    f.write_text('[rollout]\ngroup_size = 8\nmax_turns = 3\n')
    sec = config.section(config.load_file(str(f)), "rollout")
    cfg = config.build(RolloutConfig, sec, {"max_turns": 5})
    assert (cfg.group_size, cfg.max_turns, cfg.seed) == (8, 5, 0)
    with pytest.raises(InputError, match="valid:"):
        config.build(RolloutConfig, {"group_sise": 2})
    with pytest.raises(InputError, match="must be int"):
        config.build(RolloutConfig, {"group_size": "two"})


def test_config_file_bad_key_exits_2(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[aggregate-reward]\nstepp = 1\n')
    p = atom("aggregate-reward", "-", "--out", "-", "--config", f, input='{"id":"q"}\n')
    assert p.returncode == 2 and b"stepp" in p.stderr


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    cmd = [line for line in ci.splitlines() if "pytest" in line and not line.startswith("#")][0].strip()
    assert cmd in readme
