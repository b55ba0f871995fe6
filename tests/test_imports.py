"""Imports go one way: no cycle between attnkit modules, no import from a higher layer.

The graph is read from the source with `ast`, so it sees every import: module level,
inside functions (lazy imports), under `if TYPE_CHECKING:`, and
`importlib.import_module("attnkit...")` with a literal name. The layer table is the one of
/work/shared/DESIGN.md, "Layers (imports flow downward only)".
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# DESIGN.md's layer list, bottom (0) to top. A module may import modules of its own layer
# or lower ones, never a higher one. The private helpers at the package root (_io, _cpu,
# _optional, _version) are below everything; the package root `attnkit` (its lazy public
# names come from modules/ and viz/) and `attnkit.__main__` are front ends like cli/.
LAYERS = {
    "_io": 0,
    "_cpu": 0,
    "_optional": 0,
    "_version": 0,
    "functional": 1,
    "train": 1,
    "vision": 2,
    "modules": 2,
    "models": 3,
    "viz": 3,
    "distributed": 3,
    "seq2seq": 4,
    "analysis": 4,
    "integrations": 5,
    "convert": 5,
    "nn": 5,
    "cli": 6,
    "__main__": 6,
    "": 6,  # the package root, attnkit/__init__.py
}


def module_files(src: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package __init__) for every module under src/attnkit."""
    mods = {}
    for path in sorted((src / "attnkit").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def imported_names(source: str, module: str, is_pkg: bool, modules: set[str]) -> set[str]:
    """The attnkit modules `source` imports, anywhere in the file. `from a import b` is an
    import of the module a.b if there is one (like `import a.b`), else of a."""
    names = set()
    package = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            full = ".".join(base + ([node.module] if node.module else []))
            names.update(
                f"{full}.{a.name}" if f"{full}.{a.name}" in modules else full for a in node.names
            )
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names & modules


def import_graph(src: Path) -> dict[str, set[str]]:
    """attnkit module -> the attnkit modules it imports (itself excluded)."""
    mods = module_files(src)
    return {
        name: imported_names(path.read_text(encoding="utf-8"), name, is_pkg, set(mods)) - {name}
        for name, (path, is_pkg) in mods.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None. Iterative DFS, sorted for a stable report."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in sorted(graph):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def layer(module: str) -> int:
    part = module.split(".")[1] if "." in module else ""
    if part not in LAYERS:
        raise KeyError(f"{module}: add its package {part!r} to LAYERS (DESIGN.md's layer list)")
    return LAYERS[part]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if layer(b) > layer(a)
    ]


# -- the package itself ---------------------------------------------------------------


def test_no_import_cycle_in_attnkit():
    cycle = find_cycle(import_graph(SRC))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_layer_imports_a_higher_layer():
    bad = upward_imports(import_graph(SRC))
    assert not bad, "imports against DESIGN.md's layers:\n" + "\n".join(bad)


def test_every_subpackage_has_a_layer():
    for name in import_graph(SRC):
        layer(name)  # raises KeyError for a package missing from the table


def test_graph_sees_the_package():
    graph = import_graph(SRC)
    assert "attnkit.modules.attention" in graph["attnkit.modules.blocks"]
    assert "attnkit.modules.attention" in graph["attnkit.convert.torch_nn"]
    assert len(graph) > 50


# -- the checker, on made-up sources (so that the tests above can fail) ---------------


def test_imported_names_sees_lazy_relative_and_importlib_imports():
    source = (
        "import attnkit.a\n"
        "from . import sib\n"
        "from ..up import thing\n"
        "def f():\n"
        "    from attnkit.convert.torch_nn import mha_from_torch\n"
        "    import importlib\n"
        "    importlib.import_module('attnkit.viz.record')\n"
        "if TYPE_CHECKING:\n"
        "    from attnkit.cli import main\n"
    )
    modules = {
        "attnkit.a",
        "attnkit.pkg",
        "attnkit.pkg.sib",
        "attnkit.up",
        "attnkit.convert",
        "attnkit.convert.torch_nn",
        "attnkit.viz.record",
        "attnkit.cli",
        "attnkit.cli.main",
    }
    names = imported_names(source, "attnkit.pkg.mod", False, modules)
    # `from ..up import thing`: thing is a name, so the import is of attnkit.up; `from .
    # import sib` and `from attnkit.cli import main` name modules, not their packages
    assert names == {
        "attnkit.a",
        "attnkit.pkg.sib",
        "attnkit.up",
        "attnkit.convert.torch_nn",
        "attnkit.viz.record",
        "attnkit.cli.main",
    }


def test_relative_import_in_a_package_init():
    modules = {"attnkit.modules", "attnkit.modules.attention"}
    names = imported_names("from .attention import X\n", "attnkit.modules", True, modules)
    assert names == {"attnkit.modules.attention"}


@pytest.mark.parametrize(
    ("graph", "want"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"a2"}, "a2": set(), "x": {"y"}, "y": {"x"}}, ["x", "y", "x"]),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_find_cycle(graph, want):
    assert find_cycle(graph) == want


def test_upward_import_is_reported():
    graph = {"attnkit.modules.attention": {"attnkit.convert.torch_nn"}, "attnkit.convert": set()}
    assert upward_imports(graph) == [
        "attnkit.modules.attention (layer 2) imports attnkit.convert.torch_nn (layer 5)"
    ]
    assert upward_imports({"attnkit.cli.main": {"attnkit.functional.attention"}}) == []
