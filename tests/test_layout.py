"""The package layout keeps its promises: lower folders never import a stage, no import cycles,
and every module says at the top what it owns."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "atomcli"
LOWER = ("agent", "engines", "env", "rewards", "train", "demo")


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(path: Path, module: str, *, top_level_only: bool) -> set[str]:
    """atomcli modules imported by `module` (module-level statements only, or every one)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("atomcli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("atomcli"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from atomcli.stages import rollout`
    mods = _modules()
    return {m for m in found if m in mods and m != module}


def test_lower_folders_never_import_a_stage():
    offenders = []
    for name, path in _modules().items():
        if name.split(".")[1:2] and name.split(".")[1] in LOWER:
            bad = {m for m in _imports(path, name, top_level_only=False) if m.startswith("atomcli.stages")}
            offenders += [f"{name} -> {m}" for m in sorted(bad)]
    assert offenders == []


def test_no_import_cycles_at_module_level():
    mods = _modules()
    graph = {n: _imports(p, n, top_level_only=True) - {"atomcli"} for n, p in mods.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(n, stack):
        state[n] = 1
        for m in graph.get(n, ()):
            if m.startswith(n + "."):
                continue  # a package importing its own submodule
            if state.get(m) == 1:
                cycles.append(stack[stack.index(m):] + [m] if m in stack else [n, m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n, [n])
    assert cycles == []


def test_every_module_has_a_docstring_saying_what_it_owns():
    missing = [n for n, p in _modules().items() if not ast.get_docstring(ast.parse(p.read_text()))
               and n not in ("atomcli.__main__",)]
    assert missing == []


def test_the_tool_mask_is_applied_inside_the_loss():
    # README points here: the loss function itself multiplies by loss_mask (no hidden filtering elsewhere)
    src = (PKG / "train" / "grpo.py").read_text()
    body = src[src.index("def grpo_token_loss("):src.index("\ndef ", src.index("def grpo_token_loss(") + 1)]
    assert "per_token = per_token * mb.loss_mask" in body
