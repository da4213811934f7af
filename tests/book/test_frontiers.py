"""The frontiers page (book/frontiers.md) keeps its promises without a book build: every
```python block runs on its own, in a fresh interpreter, within a minute, using only torch,
course_lib and the standard library; what it prints matches the ```text block shown under it
(numbers to the precision shown, so the prose that quotes them stays true); and every chapter
link names a notebook that exists."""

from __future__ import annotations

import ast
import functools
import math
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import ROOT

PAGE = ROOT / "book" / "frontiers.md"
TEXT = PAGE.read_text(encoding="utf-8")
FENCES = re.findall(r"^```(\w*)\n(.*?)^```$", TEXT, re.M | re.S)  # (language, body) in page order
BLOCKS = [body for lang, body in FENCES if lang == "python"]
# Each block's output, in the ```text fence that follows it (prose may come between the two).
SHOWN = {body: after for (lang, body), (next_lang, after) in zip(FENCES, FENCES[1:], strict=False)
         if lang == "python" and next_lang == "text"}
TIMEOUT_S = 60
ALLOWED_IMPORTS = {"torch", "course_lib"} | set(sys.stdlib_module_names)
NUMBER = re.compile(r"[-+]?\d+(?:\.(\d+))?(?:e([-+]?\d+))?")


def _run(code: str) -> subprocess.CompletedProcess | str:
    try:
        return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"did not finish within {TIMEOUT_S} s"


@functools.cache
def _results() -> tuple:
    """Every block's result, run two at a time (the machines that run the tests have few cores)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return tuple(pool.map(_run, BLOCKS))


def _same_output(printed: str, shown: str) -> bool:
    """Same words and layout, and each number equal to the precision shown: within two units of
    its last digit, or 0.2%, so that another BLAS rounding a last digit differently passes."""
    if NUMBER.sub("#", printed).split() != NUMBER.sub("#", shown).split():
        return False
    for got, want in zip(NUMBER.finditer(printed), NUMBER.finditer(shown), strict=True):
        unit = 10.0 ** (int(want.group(2) or 0) - len(want.group(1) or ""))  # of the last digit shown
        if not math.isclose(float(got.group(0)), float(want.group(0)), rel_tol=2e-3, abs_tol=2 * unit):
            return False
    return True


def test_the_page_has_demonstrations_and_shows_their_output():
    assert len(BLOCKS) >= 4
    assert set(SHOWN) == set(BLOCKS), "show each block's output in a ```text block under it"


def test_the_output_check_tolerates_rounding_but_not_a_different_result():
    assert _same_output("a 0.941 b 1.6e+10 c 863.5\n", "a 0.942 b 1.5e+10 c 863.4\n")
    assert not _same_output("a 0.951 b\n", "a 0.941 b\n")
    assert not _same_output("b 1.8e+10\n", "b 1.5e+10\n")
    assert not _same_output("a 0.941 c\n", "a 0.941 b\n")


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_uses_only_torch_course_lib_and_the_standard_library(index):
    imported = set()
    for node in ast.walk(ast.parse(BLOCKS[index])):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= ALLOWED_IMPORTS, f"block {index} imports {sorted(imported - ALLOWED_IMPORTS)}"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs_in_a_fresh_interpreter_and_prints_what_the_page_shows(index):
    result = _results()[index]
    assert not isinstance(result, str), f"block {index} {result}"
    assert result.returncode == 0, f"block {index} failed:\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"block {index} printed nothing"
    shown = SHOWN[BLOCKS[index]]
    assert _same_output(result.stdout, shown), (
        f"block {index} now prints\n{result.stdout}\nbut the page shows\n{shown}\n"
        "update the ```text block and every number the prose quotes from it")


def test_every_chapter_link_names_a_notebook_that_exists():
    targets = re.findall(r"\{doc\}`[^`<]*<([^>]+)>`", TEXT) + re.findall(r"\]\(([^)\s]+)\)", TEXT)
    chapters = [t for t in targets if "notebooks/" in t]
    assert len(chapters) >= 3, "link the chapters the page builds on"
    for target in chapters:
        path = (PAGE.parent / target.split("#")[0]).resolve()
        path = path if path.suffix == ".ipynb" else path.with_name(path.name + ".ipynb")
        assert path.is_file(), f"{target}: no notebook {path}"
        assert path.is_relative_to(ROOT / "notebooks"), f"{target}: not a student notebook"


def test_the_page_is_in_the_table_of_contents():
    assert "file: book/frontiers\n" in (ROOT / "_toc.yml").read_text(encoding="utf-8")
