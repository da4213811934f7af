"""The build executed every solution within its budget and kept the lecture examples."""

import json
import re

import nbformat

from course_tools import config
from course_tools.book import build as book
from tests.conftest import CHAPTERS, ROOT


def test_every_solution_ran_within_its_budget_and_margin_in_cpu_seconds():
    # Budgets are counted in CPU seconds of the kernel's process tree: a busy CI machine runs the
    # same work in more wall time, and a chapter that grows is caught all the same.
    timings = json.loads((ROOT / "_build" / "timings.json").read_text())
    assert set(timings) == set(CHAPTERS)
    limit = config.BUDGET_MARGIN * config.NOTEBOOK_BUDGET_S * config.BUDGET_CPUS
    for chapter, timing in timings.items():
        assert not timing["failed"], f"{chapter} failed to run"
        cpu = timing["cpu_seconds"]
        assert 0 < cpu <= limit, f"{chapter} used {cpu} CPU seconds (limit {limit:.0f})"


def test_no_cell_uses_more_than_its_budget_and_margin_nor_a_third_of_the_cell_limit():
    # A cell's limit counts CPU seconds too (course_tools.grading.sandboxed.work_limit): the slowest cell must
    # stay far from it, however busy the machine.
    cell_limit = config.BUDGET_MARGIN * config.CELL_BUDGET_S * config.BUDGET_CPUS
    assert cell_limit <= config.cell_timeout() / 2
    timings = json.loads((ROOT / "_build" / "timings.json").read_text())
    slow = {c: t["most_cpu_cell_seconds"] for c, t in timings.items()
            if t["most_cpu_cell_seconds"] > cell_limit}
    assert not slow, f"cells over {cell_limit:.0f} CPU seconds: {slow}"


def test_a_chapter_over_its_budget_is_a_warning_not_a_failure():
    timing = {"seconds": 200.0, "cpu_seconds": 90.0, "slowest_cell": 7, "slowest_cell_seconds": 31.0}
    lines = book.budget_warnings("04_normalization", timing)
    assert lines == ["04_normalization took 200 s, over its budget of 60 s on 2 quiet cores (90 CPU seconds)",
                     "04_normalization: cell 7 took 31 s, over the budget of 20 s a cell"]
    quick = {**timing, "seconds": 50.0, "slowest_cell_seconds": 5.0}
    assert book.budget_warnings("04_normalization", quick) == []


def test_every_plot_the_chapters_draw_labels_its_axes():
    # Checked by course_tools.book.figures in each chapter's kernel, as every figure is drawn.
    timings = json.loads((ROOT / "_build" / "timings.json").read_text())
    problems = {c: t["figure_problems"] for c, t in timings.items() if t["figure_problems"]}
    assert not problems, f"figures without axis labels: {problems}"


def test_intro_shows_next_token_examples_as_input_target_pairs(html_dir):
    intro = (html_dir / "book" / "intro.html").read_text(encoding="utf-8")
    for text in ("Mary had a little", "E = M", "bagel with cream cheese"):
        assert text in intro


def test_colab_button_opens_the_student_notebook_on_the_configured_branch(html_dir):
    url, branch = config.repository()
    org_repo = url.removeprefix("https://github.com/")
    for chapter in CHAPTERS:
        page = (html_dir / "notebooks" / chapter / f"{chapter}.html").read_text(encoding="utf-8")
        expected = (f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/"
                    f"notebooks/{chapter}/{chapter}.ipynb")
        assert expected in page


def test_pages_load_no_scripts_from_other_sites(html_dir):
    # The book is served offline: widget outputs (tqdm bars) would pull require.js from a CDN.
    for page in html_dir.rglob("*.html"):
        scripts = re.findall(r'<script[^>]+src="(https?://[^"]+)"', page.read_text(encoding="utf-8"))
        assert not scripts, f"{page.relative_to(html_dir)} loads {scripts}"


def test_drop_widgets_keeps_every_other_output():
    nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
    bar = nbformat.v4.new_output("display_data", data={book.WIDGET_MIME: {"model_id": "1"},
                                                       "text/plain": "train:   0%"})
    text = nbformat.v4.new_output("stream", name="stdout", text="val loss 1.77\n")
    nb.cells = [nbformat.v4.new_code_cell("train()", outputs=[bar, text]), nbformat.v4.new_markdown_cell("x")]
    out = book.drop_widgets(nb)
    assert "widgets" not in out.metadata
    assert out.cells[0].outputs == [text]


def test_chapter_pages_open_with_the_title_not_the_install_cell(html_dir):
    for chapter in CHAPTERS:
        page = (html_dir / "notebooks" / chapter / f"{chapter}.html").read_text(encoding="utf-8")
        body = page[page.index('<article class="bd-article"'):]
        assert "COURSE_LIB_SOURCE" not in body, f"{chapter}: the install cell is on the page"
        assert body.index("<h1") < body.index('class="cell'), f"{chapter}: a cell comes before the title"


def test_every_number_the_prose_quotes_was_glued_by_this_build_and_is_in_the_release_record():
    from course_tools.book import glue_records

    for chapter in CHAPTERS:
        built = glue_records.read(glue_records.build_path(chapter))
        quoted = glue_records.used(nbformat.read(str(config.solution_path(chapter)), as_version=4))
        assert set(quoted) <= set(built), f"{chapter}: quoted but not glued: {set(quoted) - set(built)}"
        recorded = glue_records.read(glue_records.record_path(chapter))
        assert set(recorded) == set(built), (
            f"{chapter}: book/measured/{chapter}.json names {sorted(recorded)} but the build glued "
            f"{sorted(built)}: run `make release CHAPTER={chapter}` after `make book`")


def test_no_page_shows_an_unfilled_glue_role_or_substitution(html_dir):
    for page in html_dir.rglob("*.html"):
        text = re.sub(r"<script.*?</script>", "", page.read_text(encoding="utf-8"), flags=re.S)
        assert "{glue:" not in text and not re.search(r"\{\{\s*\w+\s*\}\}", text), page.name
