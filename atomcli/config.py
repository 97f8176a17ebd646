"""Config as data: TOML sections named after subcommands, and dataclass fields as flags.

Precedence is default < file < flags. Each stage owns a dataclass whose fields become its
command-line flags (`group_size` -> `--group-size`); `help` text lives in field metadata.
Unknown keys in a file fail with the list of valid ones, and so do unknown sections (a misspelled
`[rolout]` would otherwise be ignored); `true` is not an integer; a setting that carries a
credential inside a URL is refused (atomcli.safety.check_no_secret).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import tomllib

from atomcli.errors import InputError

# The sections a --config file may hold: the commands that read one (run-all reads them all).
SECTIONS = ("run-all", "sft", "rollout", "score-rrm", "score-ig", "aggregate-reward", "rft", "grpo-step", "eval")


def opt(default: Any, help: str, **meta) -> Any:
    """A config field with help text (shown in `--help`)."""
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help, **meta})
    return dataclasses.field(default=default, metadata={"help": help, **meta})


def load_file(path: str | None) -> dict:
    if not path:
        return {}
    p = Path(path)
    if not p.exists():
        raise InputError("config file not found", file=path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"invalid TOML ({e})", file=path, hint="sections are named after commands, e.g. [rollout]")
    check_sections(data, path)
    return data


def check_sections(data: dict, origin: str | None = None) -> None:
    """Every top-level key must be a known section (`grpo-step` or `grpo_step`), and a table."""
    valid = set(SECTIONS) | {s.replace("-", "_") for s in SECTIONS}
    for key, val in data.items():
        if key not in valid:
            raise InputError(f"unknown section `[{key}]`", file=origin,
                             hint="valid sections: " + ", ".join(f"[{s}]" for s in SECTIONS))
        if not isinstance(val, dict):
            raise InputError(f"config entry `{key}` must be a table [{key}]", file=origin)


def section(data: dict, name: str) -> dict:
    """The section for a command; `grpo-step` and `grpo_step` both work."""
    for key in (name, name.replace("-", "_")):
        if key in data:
            if not isinstance(data[key], dict):
                raise InputError(f"config entry `{key}` must be a table [{key}]")
            return data[key]
    return {}


def field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build(cls, file_values: dict | None = None, flags: dict | None = None, *, source: str = "config"):
    """Make a config: dataclass defaults, overridden by the file section, then by flags."""
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for origin, given in ((source, file_values or {}), ("flags", flags or {})):
        for key, val in given.items():
            k = key.replace("-", "_")
            if k not in names:
                raise InputError(f"unknown option `{key}` for {cls.__name__}", file=origin if origin != "flags" else None,
                                 hint="valid: " + ", ".join(sorted(names)))
            values[k] = _coerce(cls, k, val, origin)
    return cls(**values)


def _coerce(cls, name: str, val: Any, origin: str) -> Any:
    typ = field_types(cls)[name]
    base = [a for a in typing.get_args(typ) if a is not type(None)] or [typ]
    want = base[0] if typing.get_origin(typ) is typing.Union or type(typ).__name__ == "UnionType" else typ
    if val is None:
        return None
    if want is float and isinstance(val, int) and not isinstance(val, bool):
        return float(val)
    # bool is a subclass of int in Python: `group_size = true` would silently be 1
    if want in (int, float, str, bool) and (not isinstance(val, want) or (want is not bool and isinstance(val, bool))):
        raise InputError(f"option `{name}` must be {want.__name__}, got {val!r}", file=origin if origin != "flags" else None)
    if isinstance(val, str):
        from atomcli.safety import check_no_secret
        check_no_secret(val, f"option `{name}`")
    return val


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
