"""Committed notebooks: valid, clean, following the chapter template, student versions in sync."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import pkgutil
import re

import nbformat
import pytest

import course_lib
from course_tools import config, notebook
from course_tools.book import release
from course_tools.grading.grader import mistakes
from tests.conftest import CHAPTERS, ROOT

ALL_NOTEBOOKS = [config.solution_path(c) for c in CHAPTERS] + [config.student_path(c) for c in CHAPTERS]
LEAK_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "BEGIN MARK SCHEME")


def test_there_is_at_least_one_chapter_and_it_is_in_the_toc():
    assert CHAPTERS, "no chapter under solutions/"
    toc = (ROOT / "_toc.yml").read_text()
    for chapter in CHAPTERS:
        assert f"notebooks/{chapter}/{chapter}" in toc
        assert config.student_path(chapter).is_file(), f"{chapter}: run `make release`"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_valid_clean_nbformat4_with_python3_kernel(path):
    nb = nbformat.read(str(path), as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {i} has committed outputs"
            assert cell.execution_count is None, f"cell {i} has an execution count"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_student_notebook_has_no_answers(chapter):
    text = config.student_path(chapter).read_text(encoding="utf-8")
    for marker in LEAK_MARKERS:
        assert marker not in text


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_first_cell_is_the_install_cell_from_config(path):
    nb = notebook.read(path)
    assert nb.cells[0].cell_type == "code"
    assert nb.cells[0].source == notebook.install_cell_source()
    url, branch = config.repository()
    assert f"git+{url}@{branch}" in nb.cells[0].source


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_committed_student_notebook_equals_a_fresh_release(chapter, tmp_path):
    fresh = release.generate(chapter, tmp_path / "release", grading_dir=tmp_path / "grading")
    committed = json.loads(config.student_path(chapter).read_text(encoding="utf-8"))
    assert json.loads(fresh.read_text(encoding="utf-8")) == committed, (
        f"notebooks/{chapter} is out of sync with solutions/{chapter}: run `make release`"
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_shipped_mistake_key_was_made_from_this_release(chapter):
    shipped = mistakes.load_visible(chapter)
    assert shipped.get("sources") == mistakes.sources(chapter), (
        f"course_tools/student/known_mistakes/{chapter}.json was made from another catalogue or notebook: "
        "run `make release`")
    assert set(shipped["exercises"]) == {ex.name for ex in notebook.exercises(notebook.read(
        config.student_path(chapter)))}
    # nothing of the hidden tests: no check of the key has the words of a hidden check only
    solution = notebook.read(config.solution_path(chapter))
    tests = "\n".join(solution.cells[ex.test_cell].source for ex in notebook.exercises(solution))
    visible = notebook.hide_blocks(tests)
    hidden = "\n".join(re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", tests, re.S))
    words = {w for w in re.findall(r"f?[\"']([^\"'{\n]{12,})", hidden) if w not in visible}
    whats = [c["what"] for e in shipped["exercises"].values() for c in e["key"]]
    assert words and not [w for w in words if any(w in what for what in whats)]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_follows_the_template(chapter):
    nb = notebook.read(config.solution_path(chapter))
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert nb.cells[1].cell_type == "markdown" and nb.cells[1].source.startswith("# ")
    assert "Learning goals" in nb.cells[1].source, "learning goals belong at the top"
    assert re.search(r"^## Summary", markdown, re.M)
    assert re.search(r"^## Check yourself", markdown, re.M)
    assert "{cite:" in markdown, "cite papers from book/references.bib"
    assert any(config.SETUP_TAG in c.metadata.get("tags", []) for c in nb.cells)
    # The summary and questions come last.
    last_heading = re.findall(r"^## (.+)$", markdown, re.M)[-1]
    assert last_heading.startswith("Check yourself")


def _lines_that_break_inline_math(markdown: str) -> list[str]:
    """Lines that begin with a list marker while an inline ``$...$`` is open: Markdown reads the
    marker first, and the formula renders as raw TeX beside a stray bullet."""
    bad = []
    markdown = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.S | re.M)  # fenced code: no math there
    markdown = re.sub(r"\$\$.*?\$\$", "", markdown, flags=re.S)  # display math
    for paragraph in re.split(r"\n\s*\n", markdown):
        inside = False
        for line in paragraph.splitlines():
            if inside and re.match(r"\s*([-+*]|\d+[.)])\s", line):
                bad.append(line)
            dollars = re.sub(r"`[^`]*`", "", line).replace("\\$", "").count("$")
            inside ^= dollars % 2 == 1
    return bad


def test_the_inline_math_check_finds_a_formula_split_before_a_plus():
    assert _lines_that_break_inline_math("maps ($\\operatorname{elu}(x)\n+ 1$). Then") == ["+ 1$). Then"]
    assert _lines_that_break_inline_math("maps $\\phi(x) = x\n+ 1$ and `$HOME`\n- a list") == \
        ["+ 1$ and `$HOME`"]
    assert _lines_that_break_inline_math("$a$ and\n- a list item\n\n$$\nx\n+ 1\n$$") == []
    assert _lines_that_break_inline_math("```yaml\nargs: ['$((K + 1))/8']\n- {name: x}\n```\n- an item") == []


PROSE = ALL_NOTEBOOKS + sorted((ROOT / "book").glob("*.md"))  # every notebook and book page


def _markdown(path) -> str:
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    return "\n\n".join(c.source for c in notebook.read(path).cells if c.cell_type == "markdown")


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_formula_is_split_before_a_list_marker(path):
    assert _lines_that_break_inline_math(_markdown(path)) == []


def _authors_named_twice(markdown: str) -> list[str]:
    """"Elhage et al. {cite:p}`Elhage2021`" reads "Elhage et al. (Elhage et al., 2021)": a
    citation that follows its own author's name should be ``{cite:t}``, which writes the name once."""
    pattern = r"([A-Z][\w-]+)(?: and [A-Z][\w-]+)?(?: et al\.)?\s+\{cite:p\}`([A-Za-z-]+)\d{4}\w?`"
    return [m.group(0) for m in re.finditer(pattern, markdown)
            if m.group(1).lower() == m.group(2).lower()]


def test_the_citation_check_finds_an_author_named_twice():
    assert _authors_named_twice("Liu et al.\n{cite:p}`Liu2020` and GShard {cite:p}`Lepikhin2021`") == \
        ["Liu et al.\n{cite:p}`Liu2020`"]
    assert _authors_named_twice("{cite:t}`Liu2020` showed it {cite:p}`Xiong2020`; "
                                "Kaplan's fit {cite:p}`Kaplan2020`") == []


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_author_is_named_twice_by_a_citation(path):
    assert _authors_named_twice(_markdown(path)) == []


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_exercise_has_visible_and_hidden_tests(chapter):
    nb = notebook.read(config.solution_path(chapter))
    exercises = notebook.exercises(nb)
    assert exercises
    for ex in exercises:
        solution = nb.cells[ex.solution_cell].source
        tests = nb.cells[ex.test_cell].source
        assert "### BEGIN SOLUTION" in solution and "### END SOLUTION" in solution, ex.name
        visible, _, hidden = tests.partition("### BEGIN HIDDEN TESTS")
        assert "assert" in visible or "check_" in visible, f"{ex.name}: no visible test"
        assert "assert" in hidden or "check_" in hidden, f"{ex.name}: no hidden test"
        assert ex.points > 0


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebooks_leave_the_device_to_course_lib(chapter):
    """A notebook runs on CUDA when there is one: it never puts work on a device it names itself
    (``device="cpu"``, ``torch.device("cuda")``, ``.to("cpu")``; ``x.cpu()`` for a result and
    ``dev.type == "cuda"`` are fine)."""
    nb = notebook.read(config.solution_path(chapter))
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    pinned = re.findall(r"""[^\n]*(?:device\s*=\s*|torch\.device\(\s*|\.to\(\s*)"""
                        r"""["'](?:cpu|cuda|mps)[^\n]*""", code)
    assert not pinned, f"use course_lib.device.get_device() (or a TrainConfig's default) instead: {pinned}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_training_cells_show_their_progress(chapter):
    """Training takes seconds on a quiet laptop and minutes on a busy one: course_lib's loops show
    a progress bar (a widget in JupyterLab; the book build drops it), and no chapter turns it off."""
    nb = notebook.read(config.solution_path(chapter))
    training = re.compile(r"\b(train\.train|rlhf\.\w+)\(")  # the loops that take seconds to minutes
    silenced = [cell.source.splitlines()[0] for cell in nb.cells if cell.cell_type == "code"
                and training.search(cell.source) and re.search(r"progress\s*=\s*False", cell.source)]
    assert not silenced, f"cells that hide their progress bar: {silenced}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebooks_import_course_lib_modules_not_names(chapter):
    nb = notebook.read(config.solution_path(chapter))
    for cell in nb.cells:
        if cell.cell_type == "code":
            bad = re.findall(r"^\s*from course_lib\.(?!grading)[\w.]+ import .*$", cell.source, re.M)
            assert not bad, f"import the module instead (from course_lib import bpe): {bad}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_draws_at_least_one_picture_of_an_idea(chapter):
    nb = notebook.read(config.solution_path(chapter))
    assert any(cell.cell_type == "code" and re.search(r"\bdiagrams\.\w+\(", cell.source)
               for cell in nb.cells), \
        "no course_lib.diagrams figure in this chapter"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_figures_have_captions(chapter):
    nb = notebook.read(config.solution_path(chapter))
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and re.search(r"\bplt\.|\.plot\(|plots\.|diagrams\.", cell.source):
            figure = cell.metadata.get("mystnb", {}).get("figure", {})
            assert figure.get("caption"), f"cell {i} draws a figure without mystnb.figure.caption"
            assert cell.metadata.get("mystnb", {}).get("image", {}).get("alt"), f"cell {i}: no alt text"


@functools.cache
def _course_lib_names() -> frozenset[str]:
    """Every function and class that a course_lib module defines."""
    names = set()
    for info in pkgutil.walk_packages(course_lib.__path__, "course_lib."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        names |= {name for name, obj in vars(module).items()
                  if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__}
    return frozenset(names)


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_notebooks_do_not_redefine_course_lib_outside_exercises(chapter):
    """A chapter uses course_lib instead of copying it: outside exercise cells, no def or class
    may take the name of a course_lib function or class."""
    known = _course_lib_names()
    nb = notebook.read(config.solution_path(chapter))
    exercise_cells = {i for ex in notebook.exercises(nb) for i in (ex.solution_cell, ex.test_cell)}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in exercise_cells:
            continue
        python = re.sub(r"^\s*[%!].*$", "", cell.source, flags=re.M)  # IPython magics are not Python
        defined = {n.name for n in ast.parse(python).body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        assert not defined & known, f"cell {i} redefines {sorted(defined & known)}: use course_lib's"


# What a written question is. A manually graded answer cell (nbgrader ``solution: true,
# grade: true``, markdown or code) has no tests: the student answers the text above it, so that
# text must ask something. The prompt is the last paragraph of the markdown cell right before the
# answer, and it asks when it has a sentence that ends with "?" or an instruction to the student:
# one of the verbs below opening a sentence, or a clause after a comma or a colon ("Explain why
# ...", "In at most five sentences: say what ...", "For each model, estimate ..."). Narrative
# that only invites the reader to experiment ("Change `lr` and rerun ...") is not a question.
_INSTRUCTIONS = ("explain", "describe", "say", "give", "estimate", "compare", "argue", "justify",
                 "discuss", "predict", "derive", "write", "answer", "decide", "identify", "propose")
_ASKS = re.compile(r"(?:\A|[.:;!?]\s+|,\s+)(?:then\s+|also\s+|now\s+)?(?:" + "|".join(_INSTRUCTIONS) + r")\b"
                   r"|\?(?:\s|\Z)", re.I)


def _prompt_of(nb, i: int) -> str:
    """The paragraph a student reads right before answer cell ``i`` ("" if no markdown is there)."""
    before = nb.cells[i - 1] if i > 0 else None
    if before is None or before.cell_type != "markdown" or notebook.nbgrader_meta(before).get("solution"):
        return ""
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", before.source, flags=re.S | re.M).strip()  # fenced blocks
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith("#")]
    return paragraphs[-1].strip() if paragraphs else ""


def _answers_without_a_question(nb) -> list[str]:
    """The grade_ids of manually graded answer cells whose prompt asks nothing."""
    bad = []
    for i, cell in enumerate(nb.cells):
        meta = notebook.nbgrader_meta(cell)
        if meta.get("solution") and meta.get("grade") and not _ASKS.search(_prompt_of(nb, i)):
            bad.append(meta.get("grade_id", f"cell {i}"))
    return bad


def _written(*cells) -> nbformat.NotebookNode:
    """A notebook of markdown cells; the one given as ("answer", text) is a manually graded answer."""
    nb = nbformat.v4.new_notebook()
    for cell in cells:
        if isinstance(cell, tuple):
            answer = nbformat.v4.new_markdown_cell(cell[1])
            answer.metadata["nbgrader"] = {"grade_id": "ex_q", "solution": True, "grade": True, "points": 2}
            nb.cells.append(answer)
        else:
            nb.cells.append(nbformat.v4.new_markdown_cell(cell))
    return nb


def test_the_question_check_finds_an_answer_cell_without_a_question():
    answer = ("answer", "### BEGIN SOLUTION\nAt initialization ...\n### END SOLUTION")
    # chapter 04 before issue 49: the prompt was lost when the prose above it was rewritten
    lost = ("Is the gap between the two arrangements more than the luck of one draw? The thin lines are\n"
            "seeds 1 and 2.\n\nA small experiment like this one is fragile: with other seeds or learning "
            "rates the stuck\nrun may escape late. Change `lr`, the warm-up in `runs` or the seeds and rerun "
            "the\ntraining cells to see how robust the picture is.")
    assert _answers_without_a_question(_written(lost, answer)) == ["ex_q"]
    assert _answers_without_a_question(_written(answer)) == ["ex_q"]
    heading_only = _written("## Written question: warm-up (2 points)", answer)
    assert _answers_without_a_question(heading_only) == ["ex_q"]
    for prompt in ["## Written question (2 points)\n\nIn at most five sentences: say what each one counts.",
                   "Explain, in three to five sentences, why attention divides by $\\sqrt{D_h}$.",
                   "For each of the two models, estimate the share that tying saves. Then give one argument.",
                   "Which of the two arrangements needs a final norm, and why?",
                   f"{lost}\n\n## Written question\n\nUsing the figures, explain why."]:
        assert _answers_without_a_question(_written(prompt, answer)) == [], prompt


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_written_question_is_asked(chapter):
    """A manually graded answer cell follows the question it answers (see ``_ASKS``)."""
    nb = notebook.read(config.solution_path(chapter))
    assert _answers_without_a_question(nb) == [], (
        "answer cells with no question right above them (the last paragraph of the markdown cell before "
        "the answer must ask: a sentence ending in '?' or an instruction such as 'Explain ...')")
