"""docs/config.md is the config dataclasses written out; `--help` shows the options a user needs, and every
option it hides (advanced) is still accepted and documented."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest
import typer
from conftest import ROOT
from typer.testing import CliRunner

from atomcli import config, config_docs
from atomcli.cli import app

STAGES = ["sft", "rollout", "score-rrm", "score-ig", "aggregate-reward", "rft", "grpo-step", "eval"]


def test_docs_config_md_is_the_generator_output():
    text = (ROOT / "docs" / "config.md").read_text()
    assert text == config_docs.markdown(), "regenerate: python -m atomcli.config_docs > docs/config.md"


@pytest.mark.parametrize("section", config.SECTIONS)
def test_every_section_and_key_is_documented_with_type_default_and_help(section):
    text = config_docs.section_markdown(section)
    cls = config_docs._load(section)
    hints = typing.get_type_hints(cls)
    assert text.startswith(f"## [{section}]")
    for f in dataclasses.fields(cls):
        if hints[f.name] is dict:
            continue
        row = next(line for line in text.splitlines() if line.startswith(f"| `{f.name}`"))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        assert f"| {hints[f.name].__name__} |" in row and f"`{config_docs._toml(default)}`" in row
        assert f.metadata["help"].split()[0].replace("<", "\\<") in row
        assert ("*(advanced)*" in row) == config.is_advanced(f)


def test_run_all_section_comes_from_the_run_all_package():
    from atomcli.stages.run_all import RunAllConfig
    assert config_docs._load("run-all") is RunAllConfig
    text = config_docs.section_markdown("run-all")
    assert "| `rft_rounds` |" in text
    assert "- `judge`: [score-rrm] `judge`" in text  # the stage keys run-all sets itself are listed


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def _options(name: str) -> dict:
    return {p.name: p for p in _command(name).params if p.param_type_name == "option"}


def _shown(name: str) -> list[str]:
    out = CliRunner().invoke(app, [name, "--help"], terminal_width=200).output
    return [line.split()[0].rstrip(",") for line in out.splitlines() if re.match(r"^  +-", line)]


def test_rollout_help_lists_at_most_fifteen_options():
    shown = _shown("rollout")
    assert 8 <= len(shown) <= 15, shown
    assert {"--model", "--search", "--group-size", "--max-turns", "--limit", "--seed", "--config"} <= {
        n for line in shown for n in line.split("/")} | set(shown)
    assert "--policy-version" not in shown and "--reuse-kv" not in " ".join(shown)


@pytest.mark.parametrize("name", STAGES)
def test_help_hides_exactly_the_advanced_options(name):
    cls = config_docs._load(name)
    opts = _options(name)
    out = CliRunner().invoke(app, [name, "--help"], terminal_width=200).output
    for f in dataclasses.fields(cls):
        if f.name == "rollout" and name == "eval":
            continue  # eval's [rollout] section: not a flag
        assert opts[f.name].hidden == config.is_advanced(f), f.name
        flag = "--" + f.name.replace("_", "-")
        assert (re.search(rf"^  +{flag}[ /]", out, re.M) is None) == config.is_advanced(f), flag
    assert len(_shown(name)) <= 20  # rollout, the longest list of settings, is held to 15 above


def _sample(typ) -> tuple[list[str], object]:
    if typ is bool:
        return [], True
    return {int: (["3"], 3), float: (["0.5"], 0.5), str: (["x"], "x")}[typ]


@pytest.mark.parametrize("name", STAGES)
def test_every_hidden_flag_still_parses(name):
    cls = config_docs._load(name)
    hints = typing.get_type_hints(cls)
    cmd = _command(name)
    required = ["IN", "--out", "o"]
    advanced = [f for f in dataclasses.fields(cls) if config.is_advanced(f)]
    assert advanced or name == "rft"
    for f in advanced:
        value_args, want = _sample(hints[f.name])
        args = required + ["--" + f.name.replace("_", "-"), *value_args]
        ctx = cmd.make_context(name, args)
        assert ctx.params[f.name] == want, f.name


def test_removed_keys_keep_a_hidden_flag_and_a_documented_line():
    for name in STAGES:
        cls = config_docs._load(name)
        for key in config.removed_keys(cls):
            assert _options(name)[key].hidden
            assert f"- `{key}`" in config_docs.section_markdown(name)
