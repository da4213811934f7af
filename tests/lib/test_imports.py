"""Every course_lib module imports without side effects, its docstring examples hold, and the
modules import each other without a cycle.

The import graph is read from the source (``ast``), not from a running interpreter, so that an
import hidden in a function or behind a module ``__getattr__`` (``importlib.import_module``)
counts too; only ``if TYPE_CHECKING:`` blocks are left out, since they never run. Edges go from
module to module: ``from .layer import MoE`` in ``course_lib.moe`` is an edge to
``course_lib.moe.layer``, ``from . import x`` to ``pkg.x`` when ``x`` is a module (else to
``pkg``). Importing ``a.b.c`` also runs ``a.b``'s ``__init__``, so it adds an edge to each such
package, except the importer's own ancestors, which are already being imported when it runs
(a package's ``__init__`` importing its submodules is not a cycle; a submodule importing a
*name* from its own package's ``__init__`` is one, and a fragile one).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import course_lib
from tests.conftest import ROOT

MODULES = sorted(m.name for m in pkgutil.walk_packages(course_lib.__path__, "course_lib.")
                 if not m.name.endswith("__main__"))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_and_its_doctests_pass(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0


# --------------------------------------------------------------------------- the import graph
def source_modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` for every ``.py`` file of the package at ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST):
    """Every node of ``tree``, function bodies included, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def _absolute(name: str, level: int, module: str, is_package: bool) -> str:
    """``from {'.' * level}{name} import ...`` written in ``module``, as an absolute name."""
    if level == 0:
        return name
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imported_names(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The absolute names ``module`` imports: ``import x``, ``from x import y`` (``x.y`` when
    that is a module) and ``importlib.import_module("literal"[, __name__ | __package__ | "pkg"])``."""
    own_package = module if is_package else module.rpartition(".")[0]
    names = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, module, is_package)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            target = node.args[0].value
            anchor = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "package"), None)
            if isinstance(anchor, ast.Name) and anchor.id == "__name__":
                anchor_name = module
            elif isinstance(anchor, ast.Name) and anchor.id == "__package__":
                anchor_name = own_package
            elif isinstance(anchor, ast.Constant):
                anchor_name = anchor.value
            else:
                anchor_name = None
            level = len(target) - len(target.lstrip("."))
            if level and anchor_name:  # relative to a package: resolve as `from . import`
                base = anchor_name.split(".")
                names.add(".".join(base[:len(base) - (level - 1)] + [target[level:]]))
            elif not level:
                names.add(target)
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: modules it imports}`` within ``package`` (at ``root``), read from the source."""
    modules = source_modules(root, package)
    known = set(modules)
    graph = {}
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own_ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        edges = set()
        for name in _imported_names(tree, module, is_package, known):
            parts = name.split(".")
            if parts[0] != package:
                continue
            while ".".join(parts) not in known:  # a name inside a module: the module
                parts.pop()
            edges.add(".".join(parts))
            # importing a.b.c runs a.b's __init__ first (not the importer's own, already running)
            edges.update({".".join(parts[:i]) for i in range(1, len(parts))} - own_ancestors)
        edges.discard(module)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle ``[a, b, ..., a]`` of ``graph``, or None (depth-first search, sorted order)."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


COURSE_LIB = Path(course_lib.__file__).parent


def test_course_lib_has_no_import_cycle():
    graph = import_graph(COURSE_LIB, "course_lib")
    assert set(graph) >= set(MODULES)  # every module is in the graph
    assert "course_lib.moe.layer" in graph["course_lib.moe"]  # the graph sees package re-exports
    assert "course_lib.model" in graph["course_lib.flops"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_moe_package_depends_on_nothing_in_the_model():
    reached = _closure(import_graph(COURSE_LIB, "course_lib"), "course_lib.moe")
    assert "course_lib.moe.layer" in reached
    assert not {m for m in reached if m.startswith(("course_lib.model", "course_lib.moe_runs"))}, reached
    code = ("import sys, course_lib.moe; print(course_lib.moe.__file__); "
            "print(sorted(m for m in sys.modules if m.startswith('course_lib')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, loaded = proc.stdout.splitlines()
    assert Path(where).is_relative_to(ROOT)  # this checkout's course_lib, not an installed one
    assert "course_lib.moe.layer" in loaded and "course_lib.model" not in loaded, loaded


def _write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


# The layout this test was written against: the GPT imports the MoE layer, and the MoE package
# lazily exposed its training runs, which build GPTs.
OLD_LAYOUT = {
    "__init__.py": "",
    "model.py": "from .moe import MoE\n",
    "moe/__init__.py": """\
        import importlib

        from .layer import MoE


        def __getattr__(name):
            if name == "runs":
                return importlib.import_module(".runs", __name__)
            raise AttributeError(name)
        """,
    "moe/layer.py": "import torch\n",
    "moe/runs.py": "from ..model import GPT\n",
}


def test_the_cycle_finder_sees_a_lazy_import_cycle(tmp_path):
    graph = import_graph(_write_package(tmp_path, OLD_LAYOUT), "pkg")
    assert graph["pkg.moe"] == {"pkg.moe.layer", "pkg.moe.runs"}
    assert graph["pkg.moe.runs"] == {"pkg.model"} and graph["pkg.moe.layer"] == set()
    assert find_cycle(graph) == ["pkg.model", "pkg.moe", "pkg.moe.runs", "pkg.model"]


@pytest.mark.parametrize(("runs", "cycle"), [
    ("def main():\n    from ..model import GPT\n", True),                  # inside a function: counts
    ("from .. import model\n", True),                                       # `from .. import module`
    ("import pkg.model.gpt\n", True),                                       # a submodule runs pkg.model
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..model import GPT\n", False),
    ("from .layer import MoE\n", False),                                    # a sibling: no cycle
])
def test_the_cycle_finder_on_other_ways_to_import(tmp_path, runs, cycle):
    files = {k: v for k, v in OLD_LAYOUT.items() if k != "model.py"}  # the model as a package
    files |= {"moe/runs.py": runs, "model/__init__.py": "from ..moe import MoE\n", "model/gpt.py": ""}
    graph = import_graph(_write_package(tmp_path, files), "pkg")
    assert (find_cycle(graph) is not None) == cycle, graph


def test_a_submodule_importing_its_own_package_is_a_cycle(tmp_path):
    """``pkg.a`` taking a name from ``pkg/__init__.py``, which imports ``pkg.a``: the name may
    not exist yet when ``pkg.a`` runs. A sibling by its full path is fine."""
    sibling = {"__init__.py": "from .a import f\nfrom .b import g\n", "a.py": "from pkg.b import g\n",
               "b.py": "g = 1\n"}
    assert find_cycle(import_graph(_write_package(tmp_path / "1", sibling), "pkg")) is None
    parent = {**sibling, "a.py": "from . import g\n"}
    assert find_cycle(import_graph(_write_package(tmp_path / "2", parent), "pkg")) == ["pkg", "pkg.a", "pkg"]
