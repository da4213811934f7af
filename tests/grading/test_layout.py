"""The layout holds the design: the reference library imports none of the tooling, what runs in the
sandbox needs nothing the sandbox cannot read, a student's notebook needs no nbgrader, and no
module grows past about 500 lines.

Imports are read from the source (as ``tests/lib/test_imports.py`` does), so that an import inside
a function counts too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import course_tools
from course_tools.grading.grader import sandbox
from tests.conftest import ROOT
from tests.lib.test_imports import _closure, _imported_names, find_cycle, import_graph, source_modules

TOOLS = Path(course_tools.__file__).parent
MAX_LINES = 520  # "about 500"
# the modules a sandbox imports: the worker, the graded run, and what a notebook's cells call
SANDBOX_ENTRIES = ("course_tools.grading.sandboxed.worker", "course_tools.grading.sandboxed.graded_run",
                   "course_tools.student.checks", "course_tools.student.glue")


def imports(root: Path, package: str) -> dict[str, set[str]]:
    """``{module: every absolute name it imports}``, whatever package the name is in."""
    modules = source_modules(root, package)
    return {module: _imported_names(ast.parse(path.read_text(encoding="utf-8")), module, is_package,
                                    set(modules))
            for module, (path, is_package) in modules.items()}


def test_the_reference_library_imports_none_of_the_tooling():
    found = {m: sorted(n for n in names if n.split(".")[0] == "course_tools")
             for m, names in imports(ROOT / "course_lib", "course_lib").items()}
    assert len(found) > 20 and not {m: n for m, n in found.items() if n}


def test_what_runs_in_the_sandbox_needs_only_what_the_sandbox_can_read():
    graph = import_graph(TOOLS, "course_tools")
    modules = source_modules(TOOLS, "course_tools")
    needed = set().union(*(_closure(graph, m) for m in SANDBOX_ENTRIES))
    readable = [Path(p).resolve() for p in sandbox.SANDBOXED_CODE]
    unreadable = sorted(m for m in needed
                        if not any(modules[m][0].resolve().is_relative_to(r) for r in readable))
    assert "course_tools.student.judges" in needed and "course_tools.grading.sandboxed.wire" in needed
    assert unreadable == []
    # and nothing of the grader's side, its keys or the catalogues is readable there
    for hidden in (TOOLS / "grading" / "grader", TOOLS / "catalogues", TOOLS / "book"):
        assert not any(hidden.resolve().is_relative_to(r) for r in readable), hidden


def test_the_tooling_has_no_import_cycle():
    cycle = find_cycle(import_graph(TOOLS, "course_tools"))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_students_notebook_and_self_check_import_without_nbgrader():
    code = ("import sys; sys.modules['nbgrader'] = None\n"
            "import course_tools.student.checks, course_tools.student.glue, course_tools.student.check\n"
            "print(sorted(m for m in sys.modules if m.startswith(('course_tools.grading.grader.sandbox', "
            "'course_tools.grading.grader.grade', 'course_tools.book'))))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"  # no grading of a class, no book build loaded either


def test_no_module_is_over_about_500_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for package in ("course_lib", "course_tools") for p in (ROOT / package).rglob("*.py")}
    assert len(sizes) > 60
    assert {p: n for p, n in sizes.items() if n > MAX_LINES} == {}
