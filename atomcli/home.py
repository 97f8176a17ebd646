"""Where atomcli keeps what it builds once per machine (the converted demo model, caches):
`$ATOM_HOME`, by default `~/.cache/atomcli`.

Its own module so that `models` and `context` can both ask for it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def atom_home() -> Path:
    return Path(os.environ.get("ATOM_HOME", Path.home() / ".cache" / "atomcli"))
