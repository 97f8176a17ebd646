"""run-all refuses what it cannot honour before it writes or builds anything: presets named two ways, stage
sections that contradict [run-all], bad rft_sources, a second process on one folder; and it resumes a run folder
that was moved or is reached through a symlink. Also: the presets' help tells what they run, and the report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, atom

from atomcli.errors import InputError
from atomcli.stages import run_all
from atomcli.stages.run_all import folder, presets, report


def _lines(proc) -> list[str]:
    return [x for x in proc.stderr.decode().splitlines() if x.strip()]


# --- presets: one way to name a canned run -----------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--preset", "real", "--quick"], "--quick contradicts --preset real"),
    (["--demo", "--quick", "--preset", "learn"], "--quick contradicts --preset learn"),
    (["--preset", "nope"], "unknown preset `nope`"),
])
def test_contradictory_or_unknown_presets_are_one_line_errors(tmp_path, args, message):
    p = atom("run-all", *args, "--out", tmp_path / "run")
    assert p.returncode == 2 and message in p.stderr.decode(), p.stderr
    assert len(_lines(p)) == 1 and not (tmp_path / "run").exists()


@pytest.mark.parametrize("demo, quick, preset, name, old", [
    (True, False, None, "demo", "--demo"), (True, True, None, "quick", "--demo --quick"),
    (False, True, None, "quick", "--quick"), (True, False, "learn", "learn", "--demo --preset learn"),
    (False, False, "real", "real", None), (False, False, None, None, None)])
def test_old_spellings_name_a_preset_with_a_deprecation(demo, quick, preset, name, old):
    got, deprecated = presets.resolve(preset, demo, quick)
    assert got == name and (deprecated[0] if deprecated else None) == old


def test_the_old_spelling_still_runs_with_one_deprecation_line(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[run-all]\nsteps = -1\n")  # refused at the checks: nothing is built
    p = atom("run-all", "--demo", "--quick", "--config", cfg, "--out", tmp_path / "run")
    lines = _lines(p)
    assert p.returncode == 2 and len(lines) == 2, lines
    assert lines[0] == "warning: --demo --quick is deprecated and will be removed; use --preset quick"
    assert "steps must be >= 0" in lines[1]


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_each_presets_help_says_what_its_sections_run(name):
    ra, text = presets.PRESETS[name]["run-all"], presets.PRESET_HELP[name]
    steps, rounds = ra.get("steps", run_all.RunAllConfig.steps), ra.get("rft_rounds", 0)
    assert ("no GRPO steps" in text) == (steps == 0)
    if steps:
        assert {1: "one GRPO step", 2: "2 GRPO steps"}[steps] in text
    assert ("rejection-sampling" in text) == (rounds > 0)
    if rounds:
        assert {1: "one rejection-sampling round", 2: "two rejection-sampling rounds"}[rounds] in text
    assert ("averaged" in text) == bool(ra.get("rft_soup"))
    assert ("evals of the SFT and the soup" in text) == (ra.get("rft_eval_rounds") is False)
    assert not re.search(r"\d\.\d|session|issue", text)  # no measured numbers, no development history


def test_run_all_help_names_every_preset_and_rejection_sampling():
    text = " ".join(atom("run-all", "--help", check=True).stdout.decode().split())
    assert "rejection-sampling rounds" in text
    for name in presets.PRESETS:
        assert f"`{name}`:" in text
    assert "--demo" not in text and "--quick" not in text  # hidden: the old spellings


# --- a [run-all] setting that a stage section contradicts ----------------------------------------------------

@pytest.mark.parametrize("section, message", [
    ('[run-all]\nseed = 1\n[rollout]\nseed = 3\n', "[rollout] seed = 3 contradicts [run-all] seed = 1"),
    ('[sft]\nmodel = "other"\n', "[sft] model = 'other' contradicts [run-all] model"),
    ('[score-rrm]\njudge = "hf:smollm2"\n', "[score-rrm] judge = 'hf:smollm2' contradicts [run-all] judge"),
    ('[rollout]\nmodel = "smollm2"\n', "[rollout] model = 'smollm2' contradicts [run-all] model"),
    ('[aggregate-reward]\ntotal_steps = 9\n', "[aggregate-reward] total_steps = 9 contradicts [run-all] steps"),
])
def test_a_stage_section_that_contradicts_run_all_is_an_error_naming_both_keys(tmp_path, section, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(section)
    p = atom("run-all", "--preset", "quick", "--config", cfg, "--out", tmp_path / "run")
    assert p.returncode == 2 and message in p.stderr.decode(), p.stderr
    assert len(_lines(p)) == 1 and not (tmp_path / "run").exists()


def test_a_stage_section_that_agrees_with_run_all_is_accepted(tmp_path):
    from atomcli.context import Context
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run-all]\nseed = 2\n[rollout]\nseed = 2\n[score-rrm]\njudge = "heuristic"\n')
    settings = run_all.prepare(tmp_path / "run", "quick", str(cfg), Context(quiet=True), build=False)
    run = run_all.Run(tmp_path / "run", settings, Context(quiet=True))
    assert run.rollout.seed == 2 and run.score.judge == "heuristic"


# --- checks before the first write --------------------------------------------------------------------------

def test_bad_rft_sources_are_refused_before_the_world_is_built(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run-all]\nrft_rounds = 1\nrft_sources = "hotpot"\n')
    run = tmp_path / "run"
    t0 = time.monotonic()
    p = atom("run-all", "--demo", "--quick", "--config", cfg, "--out", run)
    err = p.stderr.decode()
    assert p.returncode == 2 and "rft_sources = 'hotpot'" in err and "demo_" in err, err
    assert not run.exists() and time.monotonic() - t0 < 60  # no world, no marker: the fixed command just runs


def test_a_preset_run_refused_after_its_world_was_built_resumes_with_corrected_settings(tmp_path):
    """The world is built before the checks that need its questions; a run refused by them has no config.json,
    so --resume takes the corrected settings, and refuses only a change to what the world was built from."""
    from atomcli.context import Context
    run = tmp_path / "run"
    bad = run_all.prepare(run, "quick", None, Context(quiet=True), build=False)
    bad["run-all"]["dev_questions"] = 1000
    folder.mark(run, bad, building=True)
    good = json.loads(json.dumps(bad))
    good["run-all"]["dev_questions"] = 2
    folder.check_same_settings(run, good)
    good["run-all"]["world_style"] = "stepwise"
    with pytest.raises(InputError, match="demo world was built for other settings.*world_style"):
        folder.check_same_settings(run, good)


def _started(run: Path, settings: dict) -> None:
    folder.mark(run, settings)
    (run / "sft").mkdir()


@pytest.mark.parametrize("how", ["symlink", "moved", "relative"])
def test_resume_finds_the_same_run_in_a_moved_or_linked_folder(tmp_path, how, monkeypatch):
    from atomcli.context import Context
    run = tmp_path / "a" / "run"
    _started(run, run_all.prepare(run, "quick", None, Context(quiet=True), build=False))
    if how == "symlink":
        there = tmp_path / "link"
        there.symlink_to(run)
    elif how == "moved":
        there = tmp_path / "b" / "run"
        there.parent.mkdir()
        run.rename(there)
    else:
        monkeypatch.chdir(tmp_path / "a")
        there = Path("run")
    folder.check_same_settings(there, run_all.prepare(there, "quick", None, Context(quiet=True), build=False))
    changed = run_all.prepare(there, "quick", None, Context(quiet=True), build=False)
    changed["run-all"]["steps"] = 5
    with pytest.raises(InputError, match=r"\[run-all\] steps: 2 -> 5"):
        folder.check_same_settings(there, changed)


def test_resume_of_a_moved_folder_marked_before_it_recorded_its_place(tmp_path):
    """A run folder from an earlier version (a marker without its place): a preset's world paths tell it."""
    from atomcli.context import Context
    run = tmp_path / "a" / "run"
    _started(run, run_all.prepare(run, "quick", None, Context(quiet=True), build=False))
    (run / "atom_run.json").write_text(json.dumps({"made_by": "atom run-all", "format": 1}))
    there = tmp_path / "b"
    run.rename(there)
    folder.check_same_settings(there, run_all.prepare(there, "quick", None, Context(quiet=True), build=False))


# --- one process per run folder -----------------------------------------------------------------------------

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_into_a_locked_folder_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run / ".atom_run.lock")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        for extra in ([], ["--resume"]):
            p = atom("run-all", "--preset", "quick", "--out", run, *extra)
            lines = _lines(p)
            assert p.returncode == 2 and len(lines) == 1, lines
            assert f"pid {holder.pid}" in lines[0] and "writing this run folder" in lines[0]
    finally:
        holder.kill()
        holder.wait()
    folder.probe_lock(run)  # released with its process


def test_the_lock_is_held_by_one_descriptor_at_a_time(tmp_path):
    fd = folder.lock(tmp_path)
    try:
        with pytest.raises(InputError, match=f"pid {os.getpid()}"):
            folder.lock(tmp_path)
        with pytest.raises(InputError, match="writing this run folder"):
            folder.probe_lock(tmp_path)
    finally:
        os.close(fd)
    os.close(folder.lock(tmp_path))


# --- the report ---------------------------------------------------------------------------------------------

def _report(name: str, f1: dict, compare_with: tuple[str, dict] | None = None) -> dict:
    from atomcli.stages import compare
    r = {"name": name, "n": len(f1), "overall": {"f1": sum(f1.values()) / len(f1), "em": 0.0, "n": len(f1)},
         "per_question": {q: {"f1": v, "em": 0.0, "source": "demo_1hop"} for q, v in f1.items()}}
    if compare_with:
        r["compare"] = compare.compare_reports(r, compare_with[1], baseline_name=compare_with[0])
    return r


def test_a_one_step_run_gets_a_table_a_verdict_with_its_interval_and_error_bars(tmp_path):
    (tmp_path / "eval").mkdir()
    base = _report("base", {f"q{i}": 0.0 for i in range(8)})
    sft = _report("sft", {f"q{i}": 0.2 for i in range(8)}, ("base", base))
    step = _report("step-0001", {f"q{i}": (0.9 if i < 6 else 0.2) for i in range(8)}, ("base", base))
    for r in (base, sft, step):
        (tmp_path / "eval" / f"{r['name']}.json").write_text(json.dumps(r))
    line = {"step": 1, "reward_mean": 0.5, "reward_std": 0.1, "kl": 0.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"run-all": {"steps": 1}}))
    text = report.write(tmp_path).read_text()
    assert not (tmp_path / "plots" / "training.png").exists()  # one point a curve: the table says it
    assert "## Training steps" in text and "| 1 | 0.5 | 0.1 | 0 |" in text
    assert (tmp_path / "plots" / "eval_f1.png").stat().st_size > 1000
    # the final checkpoint (the last step) against its SFT, not against the base model the evals compare with
    assert "Final checkpoint: **step-0001**" in text
    assert re.search(r"\*\*step-0001 beat sft\*\* \(its SFT\): F1 0\.200 -> 0\.725, ΔF1 \+0\.525 \[\+0\.\d+, "
                     r"\+0\.\d+\] over 8 questions", text), text
    assert "## What the run did" in text and "**GRPO**: 1 step," in text


def test_curves_are_drawn_only_where_there_are_two_points():
    metrics = [{"step": 1, "reward_mean": 0.1, "kl": None}, {"step": 2, "reward_mean": 0.3, "kl": 0.2}]
    assert [k for k, _ in report.curves(metrics)] == ["reward_mean"]
    assert report.curves(metrics[:1]) == []


def test_the_report_imports_nothing_that_runs_a_stage():
    src = (ROOT / "atomcli" / "stages" / "run_all" / "report.py").read_text()
    imported = set(re.findall(r"from atomcli\.stages(?:\.run_all)? import (\w+)", src)) | \
        set(re.findall(r"from atomcli\.stages\.run_all\.(\w+) import", src))
    assert imported <= {"layout", "step_metrics", "compare"}, imported
