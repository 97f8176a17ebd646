"""bench/learning.sh: every arm's TOML, layered on the learn preset, is a valid run whose reward is the one its name says."""
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from atomcli import config as cfgmod
from atomcli.stages import run_all
from atomcli.stages.aggregate_reward import AggregateConfig, check

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "learning.sh"
PRESET_REWARD = {"learn", "rft", "rft-grpo", "lr1e4"}  # arms that keep the learn preset's reward


def _arm_functions() -> str:
    """The script's reward variables and arm_config(), without running the script (no model, no run folder)."""
    text = SCRIPT.read_text()
    start, end = text.index("\nATR="), text.index("\n}\n", text.index("arm_config()"))
    return text[start:end + 3]


def _arms() -> list[str]:
    listed = re.search(r"unknown arm \$1 \(valid: ([^)]*)\)", SCRIPT.read_text()).group(1)
    return [a.strip() for a in listed.split(",")]


def _arm_settings(arm: str) -> dict:
    out = subprocess.run(["bash", "-c", _arm_functions() + f'\narm_config "{arm}"\n'], capture_output=True, text=True,
                         check=True).stdout
    return run_all._merge(run_all.LEARN, tomllib.loads(out))


def test_the_valid_list_names_every_arm_the_script_knows():
    cases = re.findall(r"^    ([a-z0-9-]+)\)", _arm_functions(), flags=re.M)
    assert sorted(cases) == sorted(_arms()) and len(cases) > 10


@pytest.mark.parametrize("arm", _arms())
def test_each_arm_is_a_valid_config_with_the_reward_its_name_says(arm):
    settings = _arm_settings(arm)
    agg = cfgmod.build(AggregateConfig, settings["aggregate-reward"], source="[aggregate-reward]")
    check(agg)  # e.g. --no-atr with process = "ig" would be refused here
    if arm in PRESET_REWARD:  # the preset's reward: information gain, per-turn credit, constant weight
        assert (agg.process, agg.credit, agg.schedule) == ("ig", "turn", "constant")
    elif arm.startswith("ig-turn"):
        assert (agg.process, agg.credit) == ("ig", "turn")
        assert agg.schedule == ("constant" if arm == "ig-turn-const" else "linear")
    elif "outcome" in arm:  # DeepResearcher's reward: F1 alone
        assert (agg.process, agg.credit) == ("none", "trajectory")
    else:  # the fused arms of sessions 13-22: Atom-Searcher's ATR with its linear schedule
        assert (agg.process, agg.credit, agg.schedule) == ("atr", "trajectory", "linear")


@pytest.mark.parametrize("arm", _arms())
def test_each_arm_trains_with_what_its_name_says(arm):
    # since session 41 the preset is one rejection-sampling round and no GRPO steps; every GRPO arm runs
    # 8 steps from the SFT checkpoint without the round, as before
    learn, settings = run_all.LEARN, _arm_settings(arm)
    ra = cfgmod.build(run_all.RunAllConfig, settings["run-all"], source="[run-all]")
    if arm in ("learn", "rft"):
        assert (ra.steps, ra.rft_rounds, ra.rft_sources, ra.rft_group_size) == (0, 1, "demo", 1)
    elif arm == "rft-grpo":
        assert (ra.steps, ra.rft_rounds, ra.rft_sources) == (8, 1, "demo")
    else:
        assert (ra.steps, ra.rft_rounds) == (8, 0)
    assert settings["grpo-step"]["lr"] == {"lr1e4": 1e-4, "fused-kl": 1e-5}.get(arm, learn["grpo-step"]["lr"])


def test_an_unknown_arm_is_refused_with_the_valid_ones():
    r = subprocess.run(["bash", "-c", _arm_functions() + '\narm_config "nope"\n'], capture_output=True, text=True)
    assert r.returncode == 2 and "valid: learn, fused, outcome" in r.stderr


def test_an_arm_refuses_an_sft_run_evaluated_on_other_questions(tmp_path):
    # an SFT run made with EVAL_LIMIT=20: an arm without it would compare its 100 answers with those 20
    import os
    import sys
    sft = tmp_path / "sft"
    for d in ("sft", "eval", "world"):
        (sft / d).mkdir(parents=True)
    for f in ("sft/model.safetensors", "eval/sft.parquet", "eval/questions.parquet"):
        (sft / f).touch()
    (sft / "config.json").write_text('{"run-all": {"eval_limit": 20}}')
    env = {**os.environ, "RUNS": str(tmp_path / "runs"), "SFT_FROM": str(sft), "TRANSFER": "0", "ARMS": "learn",
           "PY": sys.executable}
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "eval_limit = 20, this arm's 0" in r.stderr
    assert not list((tmp_path / "runs" / "learn" / "eval").iterdir())  # nothing copied, no run started
    assert not (tmp_path / "runs" / "learn" / "world").exists()  # refused before the arm folder is seeded
