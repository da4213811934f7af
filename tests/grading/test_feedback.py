"""Feedback HTML shows no hidden test and runs nothing a submission wrote.

A small autograded notebook is built here, holding what a hostile submission can leave in one:
HTML, SVG, JavaScript and widget outputs, markdown and raw cells with scripts and a
``javascript:`` link, a student cell that printed a captured hidden line (coloured and
re-spaced), and a test cell whose error traceback quotes hidden lines. It goes through the
course's preprocessors and nbconvert's HTML exporter, and once through nbgrader's real
``generate_feedback`` in a temporary course with the repository's ``nbgrader_config.py``.
"""

from __future__ import annotations

import copy
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell
from traitlets.config import PyFileConfigLoader

from course_tools import config, notebook
from course_tools.grading.grader import feedback
from course_tools.grading.grader.feedback import (
    REDACTED,
    HideTests,
    SanitizeOutputs,
    hide_blocks,
    literal_markdown,
    removed_note,
    squash,
    student_markdown,
)
from tests.conftest import ROOT

ASSIGNMENT = "zz_demo"  # no chapter of the course: every markdown cell counts as the student's
VISIBLE_TEST = "assert add(2, 3) == 5, 'add(2, 3) should be 5'"
HIDDEN = ["assert add(-7, 7) == 0, 'secret case: add(-7, 7)'", "_secret_numbers = [4, 8, 15, 16, 23, 42]"]
TEST_SOURCE = "\n".join([VISIBLE_TEST, "### BEGIN HIDDEN TESTS", *HIDDEN, "### END HIDDEN TESTS"])
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def _meta(grade_id, *, grade, solution, locked, points=None):
    block = {"grade": grade, "solution": solution, "locked": locked, "grade_id": grade_id,
             "schema_version": 3, "task": False}
    return {"nbgrader": block | ({"points": points} if points is not None else {})}


def _display(data, **kw):
    return new_output("display_data", data=data, **kw)


def autograded() -> nbformat.NotebookNode:
    """What autograding leaves of a hostile submission (before any course preprocessor)."""
    answer = new_code_cell("def add(a, b):\n    return a + b", metadata=_meta(
        "ex_add", grade=False, solution=True, locked=False))
    # Colours between the words and extra spaces: the captured line, printed "differently".
    leak = "\x1b[32m_secret_numbers\x1b[0m =  [4, 8, 15, 16,\n23, 42]\n"
    answer.outputs = [
        new_output("stream", name="stdout", text=leak),
        _display({"text/html": "<script>alert('html')</script>"}),
        _display({"image/svg+xml": "<svg onload=\"alert('svg')\"></svg>"}),
        _display({"application/javascript": "alert('js')"}),
        _display({"application/vnd.jupyter.widget-view+json": {"model_id": "</script><script>alert('w')"}}),
        _display({"image/png": PNG}, metadata={"image/png": {"width": "1 onerror=alert('png')"}}),
        new_output("execute_result", execution_count=1,
                   data={"text/plain": "'ok'", "text/html": "<b onmouseover=\"alert('b')\">ok</b>"}),
        new_output("stream", name="stdout", text=VISIBLE_TEST + "\n"),  # visible: no secret
    ]
    test = new_code_cell(TEST_SOURCE, metadata=_meta("ex_add_test", grade=True, solution=False,
                                                     locked=True, points=2.0))
    traceback = ["\x1b[0;31mAssertionError\x1b[0m  Traceback (most recent call last)",
                 f"Cell \x1b[0;32mIn[2], line 3\x1b[0m\n\x1b[1;32m----> 3\x1b[0m \x1b[38;5;28massert\x1b[39m "
                 f"{HIDDEN[0][len('assert '):]}", "\x1b[0;31mAssertionError\x1b[0m: secret case: add(-7, 7)"]
    test.outputs = [new_output("error", ename="AssertionError", evalue="secret case: add(-7, 7)",
                               traceback=traceback)]
    markdown = new_markdown_cell("My <script>alert('md')</script> and [a link](javascript:alert('link'))")
    raw = new_raw_cell("<script>alert('raw')</script>", metadata={"format": "text/html"})
    nb = new_notebook(cells=[new_markdown_cell("# Demo"), answer, test, markdown, raw])
    state = {"m": {"model_name": "</script><script>alert('state')"}}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "state": state, "version_major": 2, "version_minor": 0}}
    return nb


def _resources(assignment=ASSIGNMENT):
    return {"nbgrader": {"assignment": assignment, "notebook": assignment, "student": "alice"}}


def _feedback(nb, assignment=ASSIGNMENT):
    """The course's preprocessors in the order autograde and generate_feedback run them."""
    for pp in (SanitizeOutputs(), HideTests()):
        nb, _ = pp.preprocess(nb, _resources(assignment))
    return nb


def _shown(page: str) -> str:
    """The text a reader sees: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]*>", "", page))


def _assert_safe_feedback(page: str) -> None:
    shown = squash(_shown(page))
    for line in HIDDEN:
        assert squash(line) not in shown and line not in page
    assert "_secret_numbers" not in page
    for script in re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.S):
        assert "alert(" not in script
    assert not re.search(r"<(b|svg|img)\b[^>]*\son\w+=", page), "an event handler attribute"
    assert not re.search(r"(href|src)=[\"']?javascript:", page)
    assert '<script type="application/vnd.jupyter.widget' not in page
    assert "&lt;script&gt;alert(&#x27;md&#x27;)" in page or "&lt;script&gt;alert('md')" in page
    # What the student should see is still there.
    assert squash(VISIBLE_TEST) in shown
    assert "AssertionError: secret case: add(-7, 7)" in _shown(page)
    assert "# (hidden tests)" in _shown(page)
    assert REDACTED in _shown(page)


def test_exported_feedback_has_no_hidden_test_and_no_live_script():
    page, _ = HTMLExporter().from_notebook_node(_feedback(autograded()))
    _assert_safe_feedback(page)


@pytest.mark.filterwarnings("ignore:Your element with mimetype")  # the widget view, unrendered
def test_without_the_course_preprocessors_the_html_would_leak():
    """The hostile notebook above is hostile: the checks fail on nbconvert's plain export."""
    page, _ = HTMLExporter().from_notebook_node(autograded())
    with pytest.raises(AssertionError):
        _assert_safe_feedback(page)


def test_sanitising_keeps_what_decides_the_points():
    nb = autograded()
    nb.cells[1].outputs.append(new_output("stream", name="stderr", text="warning\n"))
    before = copy.deepcopy(nb)
    after, _ = SanitizeOutputs().preprocess(nb, _resources())
    assert after.cells[2].outputs == before.cells[2].outputs  # the error, traceback and all
    outputs = after.cells[1].outputs
    assert [o.output_type for o in outputs] == [o.output_type for o in before.cells[1].outputs]
    assert outputs[-1] == new_output("stream", name="stderr", text="warning\n")
    assert outputs[6].data == {"text/plain": "'ok'"} and outputs[6].execution_count == 1
    assert outputs[5].data == {"image/png": PNG} and outputs[5].metadata == {}
    assert outputs[1].data == {"text/plain": removed_note(["text/html"])}
    assert outputs[2].data == {"text/plain": removed_note(["image/svg+xml"])}


def test_sanitising_twice_changes_nothing_more():
    once, _ = SanitizeOutputs().preprocess(autograded(), _resources())
    twice, _ = SanitizeOutputs().preprocess(copy.deepcopy(once), _resources())
    assert twice == once
    assert once.cells[3].source == literal_markdown(autograded().cells[3].source)


def test_the_instructors_markdown_renders_as_written_and_a_students_as_text():
    chapter = "02_attention"
    nb = notebook.read(config.student_path(chapter))
    prose = next(c for c in nb.cells if c.cell_type == "markdown" and "$" in c.source)
    written = next(c for c in nb.cells
                   if c.cell_type == "markdown" and notebook.nbgrader_meta(c).get("solution"))
    original = prose.source
    written.source = "Because <img src=x onerror=alert(1)> $\\sqrt{d}$"
    out, _ = SanitizeOutputs().preprocess(nb, _resources(chapter))
    assert prose.source == original
    assert written.source == literal_markdown("Because <img src=x onerror=alert(1)> $\\sqrt{d}$")
    page, _ = HTMLExporter().from_notebook_node(out)
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_hidden_blocks_become_one_line():
    source = "a = 1\n    ### BEGIN HIDDEN TESTS\n    secret()\n    ### END HIDDEN TESTS\nb = 2"
    assert hide_blocks(source) == "a = 1\n    # (hidden tests)\nb = 2"
    assert hide_blocks("x\n### BEGIN HIDDEN TESTS\nsecret()  # no end marker") == "x\n# (hidden tests)"


def test_only_outputs_that_show_a_hidden_line_are_redacted():
    nb = _feedback(autograded())
    answer, test = nb.cells[1], nb.cells[2]
    assert answer.outputs[0].text == REDACTED + "\n"  # the captured hidden line
    assert answer.outputs[-1].text == VISIBLE_TEST + "\n"  # a visible line is no secret
    assert test.outputs[0].traceback == ["AssertionError: secret case: add(-7, 7)"]
    assert test.source == f"{VISIBLE_TEST}\n# (hidden tests)"


# --- nbgrader's own generate_feedback, with the repository's configuration --------------------


def _nbgrader(step: str, course: Path, *extra: str) -> None:
    scripts = str(Path(sys.executable).parent)  # nbgrader runs `alembic` by name
    env = dict(os.environ, PATH=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "nbgrader", step, ASSIGNMENT, "--force",
                           f"--CourseDirectory.root={course}", *extra],
                          cwd=course, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # nbgrader's add_submission
def test_nbgraders_generate_feedback_with_the_course_configuration(tmp_path):
    """The configuration's layout in a temporary course: solutions/ is the source; the
    gradebook, the autograded notebook and the feedback live under grading/."""
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    (course / "solutions" / ASSIGNMENT).mkdir(parents=True)
    (course / "grading").mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    written = new_markdown_cell("Why does add commute?", metadata=_meta(
        "ex_why", grade=True, solution=True, locked=False, points=2.0))  # graded by a person, later
    source = autograded()  # the instructor's notebook: the same cells, an answer, no outputs
    for cell in source.cells[1:3]:
        cell.outputs = []
    source.cells[1].source = "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION"
    source.cells.append(written)
    nbformat.write(source, str(course / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"))
    _nbgrader("generate_assignment", course)
    with Gradebook(f"sqlite:///{course / 'grading' / 'gradebook.db'}") as gb:
        gb.add_student("alice")
        gb.add_submission(ASSIGNMENT, "alice")
        test = gb.find_grade("ex_add_test", ASSIGNMENT, ASSIGNMENT, "alice")
        test.auto_score, test.needs_manual_grade = 0.0, False  # as autograde leaves a failed test
        gb.db.commit()
    autograded_path = course / "grading" / "autograded" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    autograded_path.parent.mkdir(parents=True)
    submission = autograded()
    submission.cells.append(nbformat.from_dict(dict(written, source="**Because** + does <b>so</b>.")))
    nbformat.write(submission, str(autograded_path))
    _nbgrader("generate_feedback", course)
    page = (course / "grading" / "feedback" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    if os.environ.get("KEEP_FEEDBACK"):
        Path(os.environ["KEEP_FEEDBACK"]).write_text(page)
    _assert_safe_feedback(page)
    # Each grade is named by its exercise, as the self-check names it; a written answer no one has
    # graded yet says so instead of scoring 0.
    toc = page.split('<div id="toc">', 1)[1].split("</ol>", 1)[0]
    assert "Test cell" not in page and "Written response" not in page
    assert re.search(r">ex_add: tests</a> \(Score: 0\.0 / 2\.0\)", toc), toc
    assert re.search(r">ex_why: written answer</a> \(not graded yet, 2\.0 points\)", toc), toc
    assert "2.0 points not graded yet" in page.split('<div id="toc">', 1)[0]
    # The written answer is rendered as Markdown, its raw HTML shown as text.
    assert "<p><strong>Because</strong> + does &lt;b&gt;so&lt;/b&gt;.</p>" in page
    _assert_offline_and_wrapping(page)


def test_the_configuration_sanitises_right_after_the_sandboxed_run():
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    steps = [pp.__name__ for pp in cfg.Autograde.autograde_preprocessors]
    assert steps[:2] == ["SandboxedExecute", "SanitizeOutputs"]
    assert [pp.__name__ for pp in cfg.GenerateFeedback.preprocessors][:2] == ["SanitizeOutputs", "HideTests"]


# --- The page: offline, wrapped, bounded --------------------------------------------------------


def _assert_offline_and_wrapping(page: str) -> None:
    """No script, style sheet or image from the network (MathJax came from a CDN), and long lines
    in outputs wrap (an error message was cut at about 150 characters)."""
    assert not re.search(r"<(script|img|iframe)\b[^>]*\bsrc=[\"']?\s*(https?:)?//", page, flags=re.I)
    assert not re.search(r"<link\b[^>]*\bhref=[\"']?\s*(https?:)?//", page, flags=re.I)
    assert not re.search(r"@import|url\(\s*[\"']?(https?:)?//", page, flags=re.I)
    assert "cdnjs" not in page and "MathJax.Hub" not in page
    assert re.search(r"div\.output_area pre[^{]*\{[^}]*white-space: pre-wrap; overflow-wrap: anywhere", page)


def _course_page(nb, resources) -> str:
    """The page as generate_feedback renders it: the course's template and configuration."""
    import nbgrader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    cfg.HTMLExporter.extra_template_paths = [  # where generate_feedback finds bootstrap.min.css
        os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader", "static",
                     "node_modules", "bootstrap", "dist", "css")]
    for cell in nb.cells:  # what NameGrades reads from the gradebook
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            meta.update(score=0.0, points=meta.get("points", 0.0), pending=False)
    info = {"notebook": ASSIGNMENT, "score": 0.0, "max_score": 2.0, "late_penalty": 0.0}
    resources["nbgrader"] = {**resources.get("nbgrader", {}), **info}
    page, _ = HTMLExporter(config=cfg).from_notebook_node(nb, resources=resources)
    return page


def _feedback_with_resources(nb):
    resources = _resources()
    for pp in (SanitizeOutputs(), HideTests()):
        nb, resources = pp.preprocess(nb, resources)
    return nb, resources


def test_the_course_page_is_offline_wraps_and_renders_written_text_inert():
    nb, resources = _feedback_with_resources(autograded())
    nb.cells.append(new_markdown_cell("$\\sqrt{d}$"))  # the instructor's math: TeX, as written
    page = _course_page(nb, resources)
    _assert_safe_feedback(page)
    _assert_offline_and_wrapping(page)
    assert "<p>My &lt;script&gt;alert('md')&lt;/script&gt; and [a link](javascript:alert('link'))</p>" in page
    assert "$\\sqrt{d}$" in page


def test_a_students_written_markdown_renders_without_html_images_or_script_links():
    assert student_markdown("**Because** <b>x</b>") == \
        "<p><strong>Because</strong> &lt;b&gt;x&lt;/b&gt;</p>\n"
    assert student_markdown("- a\n- `<i>`") == "<ul>\n<li>a</li>\n<li><code>&lt;i&gt;</code></li>\n</ul>\n"
    # an image is not loaded (offline, no tracking pixel): a "!" and a link remain
    assert student_markdown("![x](http://tracker/p.png)") == '<p>!<a href="http://tracker/p.png">x</a></p>\n'
    assert student_markdown("[x](javascript:alert(1))") == "<p>[x](javascript:alert(1))</p>\n"


def test_huge_outputs_are_cut_and_say_how_much(monkeypatch):
    """Cells that raised 50 MB errors made a 200 MB page."""
    huge = "x" * 50_000_000
    answer = new_code_cell("raise ValueError(...)")
    answer.outputs = [
        new_output("error", ename="ValueError", evalue=huge, traceback=["ValueError: " + huge]),
        new_output("stream", name="stdout", text="y" * 20_005),
        _display({"image/png": "A" * 3_000_000}),
    ]
    nb, resources = _feedback_with_resources(new_notebook(cells=[answer]))
    error, stream, image = nb.cells[0].outputs
    assert error.evalue == "x" * 20_000 + "\n... 49,980,000 more characters not shown"
    assert error.traceback == ["ValueError: " + "x" * 19_988 + "\n... 49,980,012 more characters not shown"]
    assert stream.text == "y" * 20_000 + "\n... 5 more characters not shown"
    assert image.data == {"text/plain": "[image not shown: 3,000,000 characters, more than the 2,000,000 "
                                        "a feedback page keeps per image]"}
    page = _course_page(nb, resources)
    assert len(page) < 500_000 and "49,980,012 more characters not shown" in page  # the traceback shows
    # The page as a whole: once its outputs fill it, the next output is a note.
    monkeypatch.setattr(feedback, "MAX_PAGE_CHARS", 25)
    small = new_code_cell("print(...)")
    small.outputs = [new_output("stream", name="stdout", text=c * 10) for c in "abc"]
    nb, _ = _feedback_with_resources(new_notebook(cells=[small]))
    assert [o.text for o in nb.cells[0].outputs] == ["a" * 10, "b" * 10, (
        "[output not shown: 10 characters, more than the page has left of the 25 characters "
        "of output a feedback page keeps]\n")]
