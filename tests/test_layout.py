"""The package layout keeps its promises: lower folders never import a stage, no import circles (imports
inside functions count), no module over 600 lines, nothing imports the benchmarks under bench/, and every
module says at the top what it owns."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG, TESTS, BENCH = ROOT / "atomcli", ROOT / "tests", ROOT / "bench"
MAX_LINES = 600
PATH_LOADERS = {"sys.path.insert", "sys.path.append", "importlib.util.spec_from_file_location", "runpy.run_path",
                "spec_from_file_location", "run_path"}
LOADER_NAMES = {name.rsplit(".", 1)[-1] for name in PATH_LOADERS}
LOWER = ("agent", "engines", "env", "rewards", "train", "demo")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def _nodes(path: Path) -> tuple[ast.AST, ...]:
    return tuple(ast.walk(_tree(path)))


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _imports(path: Path, module: str) -> set[str]:
    """atomcli modules imported by `module`, wherever the import statement is (module level, inside a
    function, under TYPE_CHECKING). `from atomcli.x import y` counts as importing the module `atomcli.x.y`
    when there is one, else `atomcli.x`."""
    mods = _modules()
    found = set()
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("atomcli")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("atomcli") and not node.level:
            for a in node.names:
                found.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module)
    return {m for m in found if m in mods and m != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (each one an import circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(n):
        index[n] = low[n] = len(index)
        stack.append(n)
        for m in graph.get(n, ()):
            if m not in index:
                visit(m)
                low[n] = min(low[n], low[m])
            elif m in stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            group = []
            while True:
                m = stack.pop()
                group.append(m)
                if m == n:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return sorted(out)


def _import_graph() -> dict[str, set[str]]:
    """module -> the atomcli modules it imports; a package importing its own submodules is no edge (Python
    runs the package first either way), nor is anything importing the top package `atomcli`."""
    return {n: {m for m in _imports(p, n) if m != "atomcli" and not m.startswith(n + ".")}
            for n, p in _modules().items()}


def test_lower_folders_never_import_a_stage():
    offenders = []
    for name, path in _modules().items():
        if name.split(".")[1:2] and name.split(".")[1] in LOWER:
            bad = {m for m in _imports(path, name) if m.startswith("atomcli.stages")}
            offenders += [f"{name} -> {m}" for m in sorted(bad)]
    assert offenders == []


def test_no_import_circles_counting_imports_inside_functions():
    assert _cycles(_import_graph()) == []


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    """The check itself can fail: a module-level import one way and a function-level one back is a circle."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from atomcli import context\n")
    b.write_text("def f():\n    from atomcli import models\n    return models\n")
    graph = {"atomcli.context": _imports(b, "atomcli.context"), "atomcli.models": _imports(a, "atomcli.models"),
             "atomcli.home": set()}
    assert _cycles(graph) == [["atomcli.context", "atomcli.models"]]


def test_no_module_over_600_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    assert {n: k for n, k in long.items() if k > MAX_LINES} == {}


@functools.cache
def _bench_names() -> frozenset[str]:
    return frozenset({p.stem for p in BENCH.rglob("*.py")} | {"bench"})


def _bench_imports(path: Path) -> list[str]:
    """How `path` reaches into bench/: an import of a bench module, or a path loader given a bench path."""
    bench = _bench_names()
    found = []
    for node in _nodes(path):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [])
        found += [f"{path.name}: import {n}" for n in names if n.split(".")[0] in bench]
        last = getattr(node.func, "attr", getattr(node.func, "id", "")) if isinstance(node, ast.Call) else ""
        if last in LOADER_NAMES and ast.unparse(node.func) in PATH_LOADERS and any(
                isinstance(c, ast.Constant) and "bench" in str(c.value) for c in ast.walk(node)):
            found.append(f"{path.name}: {ast.unparse(node)}")  # sys.path.insert(0, ".../bench"), ...
    return found


def test_nothing_in_the_package_or_the_tests_imports_bench(tmp_path):
    assert [x for p in sorted([*PKG.rglob("*.py"), *TESTS.rglob("*.py")]) for x in _bench_imports(p)] == []
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("import sys\nsys.path.insert(0, str(ROOT / 'bench'))\nfrom bench_grpo import main\n")
    assert len(_bench_imports(sneaky)) == 2


def test_every_module_has_a_docstring_saying_what_it_owns():
    missing = [n for n, p in _modules().items() if not ast.get_docstring(_tree(p))
               and n not in ("atomcli.__main__",)]
    assert missing == []


def test_the_tool_mask_is_applied_inside_the_loss():
    # docs/design.md points here: the loss function itself multiplies by loss_mask (no hidden filtering elsewhere)
    src = (PKG / "train" / "grpo.py").read_text()
    body = src[src.index("def grpo_token_loss("):src.index("\ndef ", src.index("def grpo_token_loss(") + 1)]
    assert "per_token = per_token * mb.loss_mask" in body
