"""No solution line, hidden test or mark scheme anywhere in the built book.

Checked in every file under _build/html: pages (tags stripped, entities unescaped, so that
syntax highlighting cannot hide a line), the search index, the downloadable notebooks.
"""

from __future__ import annotations

import html
import json
import re

import pytest

from course_tools import config, notebook
from tests.conftest import CHAPTERS

MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "MARK SCHEME")


def _region_lines(source: str, begin: str, end: str) -> list[str]:
    out, inside = [], False
    for line in source.splitlines():
        if begin in line:
            inside = True
        elif end in line:
            inside = False
        elif inside:
            out.append(line.strip())
    return out


def secret_lines(chapter: str) -> set[str]:
    """Lines of solutions, hidden tests and mark schemes that no student notebook shows.

    A line that any released notebook prints openly (``B, S, D = x.shape`` in a later chapter's
    narrative, say) gives nothing away, wherever else it appears.
    """
    nb = notebook.read(config.solution_path(chapter))
    student_text = "\n".join(config.student_path(c).read_text(encoding="utf-8") for c in CHAPTERS)
    secrets = set()
    for cell in nb.cells:
        for begin, end in (("BEGIN SOLUTION", "END SOLUTION"), ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"),
                           ("BEGIN MARK SCHEME", "END MARK SCHEME")):
            secrets.update(_region_lines(cell.source, begin, end))
    # Short or generic lines ("return out", "}") say nothing about the answer.
    return {s for s in secrets if len(s) >= 12 and json.dumps(s)[1:-1] not in student_text}


def readable_text(path) -> str:
    raw = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".html":
        raw = html.unescape(re.sub(r"<[^>]+>", "", raw))
    elif path.suffix == ".ipynb":
        raw = "\n".join(c.source for c in notebook.read(path).cells)
    return raw


@pytest.fixture(scope="module")
def site(html_dir):
    return {p: readable_text(p) for p in html_dir.rglob("*")
            if p.is_file() and p.suffix in {".html", ".js", ".ipynb", ".txt", ".json", ".inv"}
            and "mathjax" not in p.parts}


def test_no_sources_are_copied(html_dir):
    assert not (html_dir / "_sources").exists()


def test_every_chapter_page_and_its_download_exist(html_dir):
    for chapter in CHAPTERS:
        assert (html_dir / "notebooks" / chapter / f"{chapter}.html").is_file()
        download = html_dir / "notebooks" / chapter / f"{chapter}.ipynb"
        assert download.read_bytes() == config.student_path(chapter).read_bytes()


def test_no_marker_anywhere(site):
    for path, text in site.items():
        for marker in MARKERS:
            assert marker not in text, f"{marker!r} in {path}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_solution_or_hidden_test_line_anywhere(site, chapter):
    secrets = secret_lines(chapter)
    assert secrets, "expected some solution lines to look for"
    for path, text in site.items():
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"{path} contains {leaked[:3]}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_appear_as_exercises_with_figures_kept(html_dir, chapter):
    page = readable_text(html_dir / "notebooks" / chapter / f"{chapter}.html")
    assert "raise NotImplementedError()" in page
    nb = notebook.read(config.solution_path(chapter))
    figures = sum(1 for c in nb.cells if c.metadata.get("mystnb", {}).get("figure"))
    raw = (html_dir / "notebooks" / chapter / f"{chapter}.html").read_text(encoding="utf-8")
    assert raw.count("<figure") >= figures
