"""The nightly eval (examples/cron_eval.sh, `atom eval --run RUN`): it measures what the run measured,
its history records every setting that moves the number, and the series is readable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, atom

from atomcli import tableio
from atomcli.errors import InputError
from atomcli.stages import eval_history, eval_run

# the cheapest real run: the quick preset with one step, no base eval and no transfer set
CHEAP = """
[run-all]
steps = 1
eval_base = false
transfer_test = ""
transfer_search = ""
"""


@pytest.fixture(scope="module")
def cheap_run(tmp_path_factory) -> Path:
    """A quick run started from another directory with a relative --out, as a user in their project would."""
    home = tmp_path_factory.mktemp("project")
    (home / "cheap.toml").write_text(CHEAP)
    subprocess.run([sys.executable, "-m", "atomcli", "run-all", "--preset", "quick", "--config", "cheap.toml",
                    "--out", "runs/cheap"], cwd=home, check=True, capture_output=True, timeout=900,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    return home / "runs" / "cheap"


def _cron(run: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """examples/cron_eval.sh as cron runs it: from the repository, `atom` on the PATH."""
    bindir = Path(sys.executable).parent
    full = {**os.environ, "HF_HUB_OFFLINE": "1", "RUN": str(run), "PATH": f"{bindir}:{os.environ['PATH']}",
            **(env or {})}
    return subprocess.run(["bash", str(ROOT / "examples" / "cron_eval.sh"), *map(str, args)], cwd=ROOT, env=full,
                          capture_output=True, timeout=600)


def _answers(path: Path) -> dict:
    t = tableio.read_table(str(path)).to_pydict()
    return dict(zip(t["id"], zip(t["answer"], t["completion_ids"])))


# one cheap quick run-all (module fixture) serves these three; tiny-model evals after it
def test_cron_script_measures_what_the_run_measured(cheap_run, tmp_path):
    settings = json.loads((cheap_run / "config.json").read_text())
    assert not Path(settings["run-all"]["search"].split(":", 1)[1]).is_absolute()  # recorded relative to its cwd
    proc = _cron(cheap_run, "--answers", tmp_path / "answers.parquet")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    reports = sorted((cheap_run / "cron").glob("2*.json"))
    assert len(reports) == 1
    mine = json.loads(reports[0].read_text())
    theirs = json.loads((cheap_run / "eval" / "step-0001.json").read_text())
    # the run's newest checkpoint, its questions and its eval settings (not eval's own defaults: k 10, 10 x 512)
    assert mine["run"]["eval_point"] == "step-0001" and mine["model"].endswith("steps/0001/ckpt")
    assert mine["rollout"] == {**theirs["rollout"], "model": mine["model"], "search": mine["rollout"]["search"]}
    assert (mine["rollout"]["k"], mine["rollout"]["max_turns"], mine["rollout"]["max_new_tokens"]) == (2, 2, 16)
    # the same answers, token for token, and the same numbers
    assert _answers(tmp_path / "answers.parquet") == _answers(cheap_run / "eval" / "step-0001.parquet")
    assert mine["per_question"] == theirs["per_question"] and mine["overall"] == theirs["overall"]
    line = eval_history.read(cheap_run / "cron" / "history.jsonl")[-1]
    assert line["checkpoint"] == mine["model"] and line["version"] and len(line["settings_digest"]) == 16
    assert (cheap_run / "cron" / "history.png").stat().st_size > 1000 and b"eval history" in proc.stderr


def test_a_second_night_is_paired_with_the_first_and_a_changed_setting_is_reported(cheap_run):
    history = cheap_run / "cron" / "history.jsonl"
    nights = [()] * (1 if history.exists() else 2) + [("--max-new-tokens", "8")]
    for args in nights:
        proc = _cron(cheap_run, *args)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    lines = eval_history.read(history)
    assert eval_history.changes(lines[-3], lines[-2]) == []  # the same measurement: one curve
    changed = eval_history.changes(lines[-2], lines[-1])
    assert any("max_new_tokens: 16 -> 8" in c for c in changed)
    assert b"settings differ from the previous line" in proc.stderr
    assert "settings differ" in (cheap_run / "cron" / "latest.md").read_text()
    points = eval_history.series(lines)
    assert points[-2]["vs_line"] == 1 and points[-2]["paired"] == lines[0]["n"] == 4
    assert points[-2]["delta_f1"]["low"] <= points[-2]["delta_f1"]["diff"] <= points[-2]["delta_f1"]["high"]
    assert points[-1]["settings_changed"] and points[-1]["delta_f1"] is None  # a new curve starts


def test_explicit_flags_override_the_runs_settings(cheap_run, tmp_path):
    out = tmp_path / "r.json"
    atom("eval", "--run", cheap_run, "--model", cheap_run / "sft", "--limit", "2", "--out", out, check=True)
    rep = json.loads(out.read_text())
    assert rep["n"] == 2 and rep["model"] == str(cheap_run / "sft") and rep["rollout"]["k"] == 2
    assert rep["run"]["eval_point"] is None  # not the newest checkpoint: no run eval of it is implied
    sft = json.loads((cheap_run / "eval" / "sft.json").read_text())
    assert all(rep["per_question"][q] == sft["per_question"][q] for q in rep["per_question"])


def test_run_folder_errors_are_one_line(tmp_path):
    with pytest.raises(InputError, match="not a run folder"):
        eval_run.sections(str(tmp_path))
    proc = atom("eval", "--run", tmp_path / "missing", "--out", tmp_path / "r.json")
    assert proc.returncode == 2 and b"run folder not found" in proc.stderr
    assert len(proc.stderr.decode().strip().splitlines()) == 1


def test_newest_checkpoint_order_and_paths_recorded_relative(tmp_path):
    run = tmp_path / "run"
    (run / "world").mkdir(parents=True)
    (run / "world" / "index.sqlite").write_bytes(b"")
    settings = {"run-all": {"model": "smollm2"}}
    assert eval_run.newest_checkpoint(str(run), settings) == ("smollm2", "base")
    for folder, name in (("sft", "sft"), ("rft/01/ckpt", "rft-01"), ("rft/02/ckpt", "rft-02"),
                         ("rft/soup/ckpt", "rft-soup"), ("steps/0001/ckpt", "step-0001"),
                         ("steps/0010/ckpt", "step-0010")):
        (run / folder).mkdir(parents=True)
        assert eval_run.newest_checkpoint(str(run), settings)[1] != name  # incomplete: no config.json yet
        (run / folder / "config.json").write_text("{}")
        assert eval_run.newest_checkpoint(str(run), settings) == (str(run / folder), name)
    # a path recorded from the folder the run was started in is found inside the run
    assert eval_run.locate("elsewhere/run/world/index.sqlite", str(run)) == str(run / "world" / "index.sqlite")
    assert eval_run.locate("no/such/file", str(run)) == "no/such/file"


def test_split_picks_the_runs_other_question_sets_and_their_search(tmp_path):
    run = tmp_path / "run"
    (run / "eval" / "transfer").mkdir(parents=True)
    (run / "atom_run.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({
        "run-all": {"search": "local:/idx/world.sqlite", "transfer_search": "local:/idx/real.sqlite", "seed": 3},
        "rollout": {"k": 3, "max_turns": 4}, "eval": {"max_new_tokens": 192, "force_answer": True}}))
    for split, search in (("test", "local:/idx/world.sqlite"), ("transfer", "local:/idx/real.sqlite")):
        sec = eval_run.sections(str(run), split)
        assert sec["eval"] == {"max_new_tokens": 192, "force_answer": True, "search": search, "seed": 3,
                               "model": "smollm2"}
        assert sec["rollout"] == {"k": 3, "max_turns": 4}
    (run / "eval" / "transfer" / "questions.parquet").write_bytes(b"")
    assert eval_run.questions(str(run), "transfer") == str(run / "eval" / "transfer" / "questions.parquet")
    with pytest.raises(InputError, match="no questions for --split dev"):
        eval_run.questions(str(run), "dev")
    with pytest.raises(InputError, match="unknown --split"):
        eval_run.sections(str(run), "train")
    proc = atom("eval", "--split", "dev", "--out", tmp_path / "r.json", run / "eval" / "transfer" / "questions.parquet")
    assert proc.returncode == 2 and b"needs --run" in proc.stderr
