"""The similarity report: calibrated on the acceptance catalogues, copies flagged, bad input survived.

Calibration (``-s`` prints it): over the nine chapters, the highest score between two correct
answers of an exercise written differently (or one and the solution or course_lib's reference) must
stay under ``similarity.THRESHOLD``; copies of every answer and of the solution with renamed names,
other comments, blank lines and quotes, reformatted, must reach it. Entries that are the solution
(or another entry) with one line changed are near-copies by construction: reported, not asserted.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import itertools
import json
import random

import pytest

from course_tools import config, notebook
from course_tools.__main__ import main
from course_tools.catalogues.mutants import apply
from course_tools.grading.grader import similarity
from tests.helpers import acceptance, write

CHAPTERS = config.chapters()


def disguise(source: str, known: dict[str, str], seed: int = 0) -> str:
    """``source`` with every name it binds renamed, reformatted by ``ast``, comments and blank
    lines added and double quotes: what a student hiding a copy does first."""
    rnd = random.Random(seed)
    tree = ast.parse(source)
    keep = set(dir(builtins)) | set(known) | set(similarity._imports(tree))
    names: dict[str, str] = {}

    def new(name: str) -> str:
        return name if name in keep else names.setdefault(name, f"my_{name.lower()}_{len(names)}")

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = new(node.id)
            return node

        def visit_arg(self, node):
            node.arg = new(node.arg)
            return node

    lines = []
    for line in ast.unparse(Rename().visit(tree)).splitlines():
        lines.append(line + (f"  # step {rnd.randint(1, 9)} of my own" if rnd.random() < 0.5 else ""))
        if rnd.random() < 0.3:
            lines.append("")
    return "\n".join(lines).replace("'", '"')


def _changed_lines(a: str, b: str) -> int:
    return sum(1 for line in difflib.ndiff(a.splitlines(), b.splitlines()) if line[:1] in "+-")


def _answers(chapter: str) -> dict[str, list[tuple[dict, str]]]:
    """Exercise -> [(catalogue entry, the answer cell it gives)]."""
    sol = similarity.answer_cells(notebook.read(config.solution_path(chapter)))
    out: dict[str, list[tuple[dict, str]]] = {}
    for entry in acceptance(chapter):
        out.setdefault(entry["grade_id"], []).append((entry, apply(entry, sol[entry["grade_id"]])))
    return out


def _by_construction(a: tuple[dict | None, str], b: tuple[dict | None, str]) -> bool:
    """A find/replace entry, or two answers one line apart, are near-copies by construction."""
    return any(e is not None and "find" in e for e in (a[0], b[0])) or _changed_lines(a[1], b[1]) <= 2


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_calibration_on_the_acceptance_catalogue(chapter):
    sol = similarity.answer_cells(notebook.read(config.solution_path(chapter)))
    known = similarity._setup_names(chapter)
    honest, near, disguised = [], [], []
    for ex, entries in _answers(chapter).items():
        docs = [(None, sol[ex], "solution"), *((e, src, e["why"][:50]) for e, src in entries)]
        if (ref := similarity.reference_source(ex)) is not None:
            docs.append((None, ref, "course_lib"))
        prints = [similarity.prints(src, chapter, ex) for _, src, _ in docs]
        for (a, pa), (b, pb) in itertools.combinations(zip(docs, prints, strict=True), 2):
            if min(len(pa), len(pb)) < similarity.MIN_PRINTS:
                continue
            row = (similarity.score(pa, pb), ex, a[2], b[2])
            (near if _by_construction(a[:2], b[:2]) else honest).append(row)
        for i, ((_, src, why), p) in enumerate(zip(docs, prints, strict=True)):
            if why != "course_lib" and len(p) >= similarity.MIN_PRINTS:
                copy = similarity.prints(disguise(src, known, i), chapter, ex)
                disguised.append((similarity.score(p, copy), ex, why))
    top, low = max(honest), min(disguised)
    print(f"\n{chapter}: highest acceptance pair {top[0]:.2f} ({top[1]}), lowest disguised copy {low[0]:.2f}")
    for row in sorted(near, reverse=True):
        if row[0] >= similarity.THRESHOLD:
            score, ex, a, b = row
            print(f"  near-copy by construction flagged: {score:.2f} ({ex}: {a[:24]} / {b[:24]})")
    assert top[0] < similarity.THRESHOLD, f"correct answers written differently flagged: {top}"
    assert low[0] >= similarity.THRESHOLD, f"a disguised copy not flagged: {low}"


def _grading_with(tmp_path, chapter: str, students: dict[str, dict[str, str]]):
    """A grading folder where each student answered the given exercises (the others untouched)."""
    for who, answers in students.items():
        nb = notebook.read(config.student_path(chapter))
        for cell in nb.cells:
            gid = notebook.nbgrader_meta(cell).get("grade_id")
            if notebook.nbgrader_meta(cell).get("solution") and gid in answers:
                cell.source = answers[gid]
        write(nb, tmp_path / "submitted" / who / chapter / f"{chapter}.ipynb")
    return tmp_path


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_class_of_acceptance_answers_is_not_flagged(tmp_path, chapter):
    """Student i answers every exercise with its i-th acceptance entry: through the whole report,
    the only pairs listed are near-copies by construction."""
    per_ex = _answers(chapter)
    sol = similarity.answer_cells(notebook.read(config.solution_path(chapter)))
    students = {f"s{i}": {ex: entries[i][1] for ex, entries in per_ex.items() if i < len(entries)}
                for i in range(max(map(len, per_ex.values())))}
    entry_of = {(f"s{i}", ex): item for ex, entries in per_ex.items() for i, item in enumerate(entries)}
    result = similarity.compare(chapter, _grading_with(tmp_path, chapter, students))
    assert not result.skipped
    for p in result.pairs:
        a = entry_of[(p.a.who, p.exercise)]
        b = entry_of.get((p.b.who, p.exercise)) or (None, sol[p.exercise] if p.b.who == "solution" else "")
        assert _by_construction(a, b), f"{p.exercise}: {p.a.who} and {p.b.who} flagged at {p.score:.2f}"


def _nb_json(chapter: str, answer: str) -> dict:
    nb = notebook.read(config.student_path(chapter))
    for cell in nb.cells:
        if notebook.nbgrader_meta(cell).get("grade_id") == "ex_attention_weights":
            cell.source = answer
    return json.loads(json.dumps(nb))


def test_copies_flagged_bad_submissions_survived_html_escaped(tmp_path):
    chapter = "02_attention"
    known = similarity._setup_names(chapter)
    sol = similarity.answer_cells(notebook.read(config.solution_path(chapter)))
    (entry, original), *_ = _answers(chapter)["ex_rope"]
    hostile = disguise(sol["ex_attention_weights"], known, 3).replace(
        "return", "# </pre><script>alert(1)</script> \ud800\n    return", 1)
    g = _grading_with(tmp_path, chapter, {
        "Jane_Doe_1001": {"ex_rope": original},
        "copier_1002": {"ex_rope": disguise(original, known, 1),
                        "ex_attention_weights": hostile.replace("\ud800", "")},
        "solution_copier_1003": {"ex_causal_mask": disguise(sol["ex_causal_mask"], known, 2)},
        "no_answer_1004": {},
    })
    # A lone surrogate, a mark-up name and the hostile comment: written as JSON with escapes.
    (g / "submitted" / "<b>x<" / chapter).mkdir(parents=True)
    (g / "submitted" / "<b>x<" / chapter / f"{chapter}.ipynb").write_text(
        json.dumps(_nb_json(chapter, hostile)), encoding="ascii")
    (g / "submitted" / "broken_1005" / chapter).mkdir(parents=True)
    (g / "submitted" / "broken_1005" / chapter / f"{chapter}.ipynb").write_text("{not json")
    (g / "submitted" / "empty_1006" / chapter).mkdir(parents=True)
    nb = notebook.read(config.student_path(chapter))  # the answer cell deleted
    nb.cells = [c for c in nb.cells if notebook.nbgrader_meta(c).get("grade_id") != "ex_rope"]
    write(nb, g / "submitted" / "no_cell_1007" / chapter / f"{chapter}.ipynb")

    column = similarity.similar_column(chapter, g)
    assert column["copier_1002"].startswith("ex_attention_weights: 1.00 with ")
    assert column["<b>x<"].startswith("ex_attention_weights: 1.00 with ")
    assert "ex_rope: 1.00 with Jane_Doe_1001" in column["copier_1002"]
    assert column["Jane_Doe_1001"] == "ex_rope: 1.00 with copier_1002"
    assert column["solution_copier_1003"] == "ex_causal_mask: 1.00 with solution"
    assert column["no_answer_1004"] == column["no_cell_1007"] == ""
    assert column["broken_1005"].startswith("not compared: not a valid notebook")
    assert column["empty_1006"] == "not compared: no notebook submitted"

    assert main(["similar", "02", "--grading-dir", str(g)]) == 0
    page = (g / "similarity" / f"{chapter}.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;/pre&gt;&lt;script&gt;" in page and "&lt;b&gt;x&lt;" in page
    assert "<b>" not in page and "\\ud800" in page and "http" not in page
    assert page.index("copier_1002") < page.index("solution_copier_1003")  # exercises in order
