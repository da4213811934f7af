"""The book build with a broken chapter: the others are built, the broken one is named in one line
(chapter, exercise, the error's last line) and built without outputs, and nothing hidden is shown.

The chapter is broken the way a maintainer breaks one: a wrong reference solution that the
visible tests accept and a hidden test rejects. The test stages two chapters of a copy of the
course (``COURSE_ROOT``), as ``make book`` does before Jupyter Book runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import nbformat

from course_tools import notebook
from course_tools.book import build as book
from course_tools.catalogues import mutants
from tests.conftest import ROOT

GOOD, BROKEN = "01_tokenization", "02_attention"
WRONG = "ignores the batch size"  # passes the visible tests, fails a hidden one

STAGE = """
import json
from pathlib import Path
from course_tools.book import build as book
timings, failures = book.stage(Path("_build"), ["01_tokenization", "02_attention"])
print("RESULT" + json.dumps([f.line() for f in failures]))
"""


def _course_copy(tmp_path):
    root = tmp_path / "course"
    root.mkdir()
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "book", root / "book")
    for chapter in (GOOD, BROKEN):
        for kind in ("solutions", "notebooks"):
            shutil.copytree(ROOT / kind / chapter, root / kind / chapter)
    path = root / "solutions" / BROKEN / f"{BROKEN}.ipynb"
    nb = notebook.read(path)
    [entry] = [e for e in mutants.load_catalogue(BROKEN, "mutant") if e["why"] == WRONG]
    [ex] = [ex for ex in notebook.exercises(nb) if ex.name == entry["grade_id"]]
    nb.cells[ex.solution_cell].source = mutants.apply(entry, nb.cells[ex.solution_cell].source)
    nbformat.write(nb, str(path))
    return root, nb


def test_a_broken_chapter_is_named_in_one_line_and_the_others_are_built(tmp_path):
    root, broken = _course_copy(tmp_path)
    proc = subprocess.run([sys.executable, "-c", STAGE], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "COURSE_ROOT": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert line.startswith(f"{BROKEN}: exercise ex_kv_cache_bytes (its test cell): ")
    assert "\n" not in line and len(line) < 400

    # nothing of the hidden tests or the solutions reached the terminal
    secrets = book._secrets(broken)
    assert secrets
    printed = proc.stdout + proc.stderr
    assert not [s for s in secrets if s in printed]
    assert "Traceback" not in printed

    staged = root / "_build" / "stage" / "notebooks"
    good = notebook.read(staged / GOOD / f"{GOOD}.ipynb")
    assert any(c.get("outputs") for c in good.cells if c.cell_type == "code")  # executed
    bad = notebook.read(staged / BROKEN / f"{BROKEN}.ipynb")
    assert not any(c.get("outputs") for c in bad.cells if c.cell_type == "code")
    assert "failed to run when the book was built" in bad.cells[2].source
    page = "\n".join(c.source for c in bad.cells)
    assert not [s for s in secrets if s in page]  # answers stripped from the failed page too


def test_a_message_that_quotes_a_hidden_line_is_withheld():
    nb = notebook.read(ROOT / "solutions" / BROKEN / f"{BROKEN}.ipynb")
    ex = notebook.exercises(nb)[0]
    hidden = next(s for s in book._secrets(nb) if s in nb.cells[ex.test_cell].source)
    fail = book.failure(BROKEN, nb, book.NotebookFailed(ex.test_cell, f"NameError: {hidden}"))
    assert fail.error == book.WITHHELD and fail.where == f"exercise {ex.name} (its test cell)"
    plain = book.failure(BROKEN, nb, book.NotebookFailed(ex.solution_cell, "ValueError: bad shape"))
    assert plain.line() == f"{BROKEN}: exercise {ex.name} (its solution cell): ValueError: bad shape"


RESTAGE = """
import json
from pathlib import Path
from course_tools.book import build as book
timings = json.loads(Path("_build/timings.json").read_text())
timings, failures = book.stage(Path("_build"), ["01_tokenization"], keep=timings)
print("RESULT" + json.dumps(sorted(timings)))
"""


def test_one_chapter_is_rebuilt_into_a_staged_book_and_only_into_one(tmp_path):
    root, _ = _course_copy(tmp_path)
    env = {**os.environ, "COURSE_ROOT": str(root)}
    # no earlier build: refused, with what to do
    proc = subprocess.run([sys.executable, "-m", "course_tools", "book", "--chapter", "01"],
                          capture_output=True, text=True, cwd=root, env=env)
    assert proc.returncode != 0 and "run make book (every chapter) once" in proc.stderr
    # an earlier build of both chapters (the broken one fails, its page says so), then chapter 01 alone
    (root / "_build").mkdir()
    staged = root / "_build" / "stage" / "notebooks"
    (root / "_build" / "timings.json").write_text(json.dumps({BROKEN: {"seconds": 0.0}}))
    (staged / BROKEN).mkdir(parents=True)
    kept = staged / BROKEN / "kept.txt"
    kept.write_text("from the earlier build")
    proc = subprocess.run([sys.executable, "-c", RESTAGE], capture_output=True, text=True, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.split("RESULT", 1)[1]) == [GOOD, BROKEN]
    assert kept.read_text() == "from the earlier build"  # the other chapter's page is left as it was
    assert (staged / GOOD / f"{GOOD}.ipynb").is_file()
    assert f"[1/1] {GOOD}: " in proc.stdout  # one progress line a chapter when not on a terminal
