"""Build the HTML book so that no answer ever reaches a reader.

For each chapter the solution notebook is executed once (nbclient, the course's per-cell time
limit). From the executed copy nbgrader's own preprocessors remove hidden tests and solution
code; the outputs of solution and test cells are cleared, all other outputs (figures) kept. The
result is staged under ``_build/stage/notebooks/NN_name/`` beside the prose pages, and Jupyter
Book builds the stage with execution off and without copying sources. Seconds per notebook,
those of its slowest cell and figures without axis labels go to ``_build/timings.json``; a
notebook over 1.5 times its budget (``config.BUDGET_MARGIN``) fails the build.

The prose quotes what its page measured: a chapter's values glued by its run (:mod:`.glue`) are
pasted by myst-nb and recorded in ``_build/glue/NN_name.json`` for release, and the book's own pages
get this build's chapter times as MyST substitutions (``{{ chapter_03_seconds }}``).

A chapter that fails to execute does not stop the build: its page is built from the notebook
unexecuted (answers stripped all the same) under a warning, the other chapters are built as
usual, and the build then fails with one line per broken chapter: the chapter, the exercise or
cell, and the error's last line. Nothing else of the failure is printed (nbclient's error would
show the failing cell, hidden tests included), and a message that quotes hidden test or solution
code is withheld.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import nbformat
import yaml
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

from course_tools import config, notebook
from course_tools.book import figures, glue_records
from course_tools.grading.sandboxed import work_limit

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WITHHELD = "(message withheld: it quotes hidden test or solution code)"


class NotebookFailed(Exception):
    """A notebook stopped at cell ``index`` (of the notebook as read) with ``error``, one line."""

    def __init__(self, index: int, error: str):
        super().__init__(f"cell {index}: {error}")
        self.index, self.error = index, error


@dataclass(frozen=True)
class ChapterFailure:
    chapter: str
    where: str  # "exercise ex_name (its test cell)" or "cell 12"
    error: str

    def line(self) -> str:
        return f"{self.chapter}: {self.where}: {self.error}"


@dataclass
class Run:
    """A notebook's run: the executed copy, its wall seconds, each code cell's CPU seconds (the
    kernel's process tree; by index into ``nb.cells``) and the figures without axis labels."""

    nb: nbformat.NotebookNode
    seconds: float
    cell_cpu: dict[int, float]
    figure_problems: list[str]

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cell_cpu.values())


def execute(path: Path, timeout: int | None = None, folder: Path | None = None, on_cell=None) -> Run:
    """Run a notebook top to bottom in ``folder`` (default: its own). Two cells, added around the
    notebook and removed after, check every
    figure it draws for axis labels (:mod:`.figures`).

    A cell may use ``timeout`` CPU seconds of the kernel's process tree (default: the course's
    limit; :mod:`.work_limit`), so that a busy machine runs what a quiet one runs; a wall clock
    ``work_limit.BACKSTOP`` times longer stops a cell that only waits.
    ``on_cell(index, count, seconds)`` is called before each code cell (the progress line). The
    kernel's own log is kept from the terminal: its last line is the cause given for a death."""
    nb = notebook.read(path)
    nb.cells.insert(0, nbformat.v4.new_code_cell(figures.WATCH_CELL))
    nb.cells.append(nbformat.v4.new_code_cell(figures.REPORT_CELL))
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    running = [0, 0.0]  # the index of the cell being run and when it started, for the error
    start = time.perf_counter()

    def on_cell_start(cell, cell_index):
        running[:] = [cell_index, time.perf_counter()]
        if on_cell is not None and cell.cell_type == "code":
            on_cell(cell_index - 1, len(code), time.perf_counter() - start)

    def failed(error: str) -> NotebookFailed:
        return NotebookFailed(running[0] - 1, f"{error} (after {time.perf_counter() - running[1]:.0f} s)")

    client = work_limit.WatchedClient(
        nb, timeout or config.cell_timeout(), kernel_name="python3",
        resources={"metadata": {"path": str(folder or path.parent)}}, on_cell_start=on_cell_start,
        shutdown_kernel="immediate",  # nothing to save; a graceful stop of a busy kernel only waits
    )
    with tempfile.TemporaryFile("w+") as kernel_log:
        try:
            client.execute(env=config.kernel_env(), stderr=kernel_log)
        except CellTimeoutError:
            raise failed(client.past_backstop()) from None
        except DeadKernelError:
            if client.stopped:
                raise failed(client.stopped) from None
            kernel_log.seek(0)
            raise failed(f"the kernel died ({client.death(kernel_log.read())})") from None
        except CellExecutionError as e:  # its text shows the cell: keep the error name and message
            message = (e.evalue or "").strip().splitlines()
            error = f"{e.ename}: {message[-1] if message else ''}".rstrip(": ")[:300]
            raise NotebookFailed(running[0] - 1, error) from None
    seconds = time.perf_counter() - start
    nb.cells.pop(0)
    found = figures.read_report(nb.cells.pop())
    index_of = {cell.source: i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"}
    problems = [f"cell {index_of.get(f['source'], '?')}: {f['problem']}" for f in found]
    cell_cpu = {i - 1: cpu for i, cpu in client.cpu_s.items() if 0 < i <= len(nb.cells)}
    return Run(nb, seconds, cell_cpu, problems)


def slowest_cell(nb: nbformat.NotebookNode) -> tuple[float, int]:
    """(seconds, index) of the cell of an executed notebook that took longest, from the execution
    times nbclient records in each cell's metadata."""
    def seconds(cell) -> float:
        times = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in times or "shell.execute_reply" not in times:
            return 0.0
        start, end = (datetime.fromisoformat(times[k].replace("Z", "+00:00"))
                      for k in ("iopub.execute_input", "shell.execute_reply"))
        return (end - start).total_seconds()

    return max((seconds(cell), i) for i, cell in enumerate(nb.cells))


def strip_answers(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove solutions and hidden tests, and the outputs of every graded or solution cell."""
    nb, _ = ClearHiddenTests().preprocess(nb, {})
    nb, _ = ClearSolutions(code_stub={"python": config.CODE_STUB}).preprocess(nb, {})
    for cell in nb.cells:
        meta = notebook.nbgrader_meta(cell)
        if cell.cell_type == "code" and (meta.get("solution") or meta.get("grade")):
            cell.outputs = []
            cell.execution_count = None
    return nb


def drop_widgets(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Remove ipywidget outputs (tqdm's notebook bars) and their saved state.

    A static page cannot render them, and Jupyter Book would load the widget scripts from a CDN.
    """
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET_MIME not in o.get("data", {})]
    return nb


def hide_install_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Tag cell 0, the install cell (for Colab), ``remove-cell``: the page opens with its title."""
    tags = nb.cells[0].metadata.setdefault("tags", [])
    if "remove-cell" not in tags:
        tags.append("remove-cell")
    return nb


def mathjax_dir() -> Path:
    """MathJax 3 from the ``django-static-mathjax`` wheel (installed at set-up, never committed)."""
    spec = importlib.util.find_spec("mathjax")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "MathJax is missing: pip install --no-deps django-static-mathjax (make book does this)."
        )
    es5 = Path(spec.submodule_search_locations[0]) / "static" / "mathjax" / "es5"
    if not (es5 / "tex-chtml.js").is_file():
        raise RuntimeError(f"No tex-chtml.js under {es5}")
    return es5


def _secrets(nb: nbformat.NotebookNode) -> set[str]:
    """Lines of hidden tests and of solutions (between the solution markers) that a student's copy
    never shows, long enough to say something (>= 10 characters)."""
    hidden, shown = set(), set()
    for cell in nb.cells:
        meta = notebook.nbgrader_meta(cell)
        lines = cell.source.splitlines()
        if meta.get("grade") and not meta.get("solution"):  # a test cell: its hidden blocks
            public = notebook.hide_blocks(cell.source).splitlines()
            hidden |= {line.strip() for line in lines if line not in public}
            shown |= {line.strip() for line in public}
        elif meta.get("solution"):
            inside = False
            for line in lines:
                inside = (inside or "BEGIN SOLUTION" in line) and "END SOLUTION" not in line
                (hidden if inside else shown).add(line.strip())
        else:
            shown |= {line.strip() for line in lines}
    public = "\n".join(shown)  # a hidden line that a shown one contains gives nothing away
    return {line for line in hidden - shown if len(line) >= 10 and line not in public}


def failure(chapter: str, nb: nbformat.NotebookNode, error: NotebookFailed) -> ChapterFailure:
    """Where ``chapter``'s notebook ``nb`` failed, in words, with the error unless it quotes a secret."""
    where = f"cell {error.index}"
    for ex in notebook.exercises(nb):
        if error.index == ex.solution_cell:
            where = f"exercise {ex.name} (its solution cell)"
        elif error.index == ex.test_cell:
            where = f"exercise {ex.name} (its test cell)"
    leaks = any(secret in error.error for secret in _secrets(nb))
    return ChapterFailure(chapter, where, WITHHELD if leaks else error.error)


def failed_page(nb: nbformat.NotebookNode, fail: ChapterFailure) -> nbformat.NotebookNode:
    """The unexecuted notebook under a warning, so that the book keeps its page."""
    warning = nbformat.v4.new_markdown_cell(
        f"```{{warning}}\nThis chapter failed to run when the book was built ({fail.where}: "
        f"{fail.error}), so its outputs and figures are missing.\n```")
    nb.cells.insert(2, warning)  # after the install cell and the title
    return nb


def measure(chapter: str, on_cell=None) -> Run:
    """Execute ``chapter``'s solution and record what it glues (``_build/glue/NN_name.json``, read
    by release); fails if the prose quotes a name that the run did not glue."""
    measured_with = glue_records.sources(chapter)  # before the run: an edit during it makes the record stale
    run = execute(config.solution_path(chapter), on_cell=on_cell)
    found = glue_records.values(run.nb)
    missing = [name for name in glue_records.used(run.nb) if name not in found]
    if missing:
        raise NotebookFailed(len(run.nb.cells) - 1, f"the prose quotes {missing}, which no cell glues")
    glue_records.write(glue_records.build_path(chapter), found, measured_with)
    return run


SELFCHECK_RECORD = config.root() / "book" / "measured" / "selfcheck.json"  # benchmarks/bench_selfcheck.py


def substitutions(timings: dict[str, dict], selfcheck: dict | None = None) -> dict[str, str]:
    """What the book's own pages quote (MyST substitutions: ``{{ chapter_03_seconds }}``).

    Of this build, on the machine that built it: ``chapter_NN_seconds`` for each chapter,
    ``slowest_chapter_seconds``, and ``chapters_minutes``, the time to run them all. Of the
    self-check's last benchmark (``selfcheck``, the record of ``benchmarks/bench_selfcheck.py``;
    ``SELFCHECK_RECORD`` when None): ``selfcheck_NN_seconds`` (the whole notebook),
    ``selfcheck_NN_exercise_seconds`` (its slowest exercise alone), ``selfcheck_exercise_seconds``
    (the slowest of all), ``selfcheck_machine`` and ``selfcheck_date``."""
    seconds = {c[:2]: t["seconds"] for c, t in timings.items()}
    out = {f"chapter_{nn}_seconds": f"{s:.0f}" for nn, s in seconds.items()}
    out["slowest_chapter_seconds"] = f"{max(seconds.values(), default=0):.0f}"
    out["chapters_minutes"] = f"{sum(seconds.values()) / 60:.1f}"
    if selfcheck is None:
        selfcheck = json.loads(SELFCHECK_RECORD.read_text()) if SELFCHECK_RECORD.exists() else {}
    runs = selfcheck.get("chapters", {})
    for chapter, run in runs.items():
        out[f"selfcheck_{chapter[:2]}_seconds"] = f"{run['whole']:.0f}"
        out[f"selfcheck_{chapter[:2]}_exercise_seconds"] = f"{max(run['exercises'].values()):.1f}"
    if runs:
        out["selfcheck_exercise_seconds"] = f"{max(max(r['exercises'].values()) for r in runs.values()):.1f}"
        out["selfcheck_machine"], out["selfcheck_date"] = selfcheck["machine"], selfcheck["date"]
    return out


def budget_warnings(chapter: str, timing: dict) -> list[str]:
    """Lines for a chapter whose run was over its budgets (``config.NOTEBOOK_BUDGET_S`` and
    ``CELL_BUDGET_S`` on 2 quiet cores): a warning for the user, never a failure. The tests hold
    the CPU seconds to the budgets (``tests/book/test_build.py``), which load does not change."""
    out = []
    if timing["seconds"] > config.NOTEBOOK_BUDGET_S:
        out.append(f"{chapter} took {timing['seconds']:.0f} s, over its budget of "
                   f"{config.NOTEBOOK_BUDGET_S:.0f} s on 2 quiet cores "
                   f"({timing['cpu_seconds']:.0f} CPU seconds)")
    if timing["slowest_cell_seconds"] > config.CELL_BUDGET_S:
        out.append(f"{chapter}: cell {timing['slowest_cell']} took {timing['slowest_cell_seconds']:.0f} s, "
                   f"over the budget of {config.CELL_BUDGET_S:.0f} s a cell")
    return out


def _progress(prefix: str):
    """A callback for :func:`execute` that rewrites one terminal line per cell; None (silent) when
    standard output is not a terminal, so that CI logs keep one line a chapter."""
    if not sys.stdout.isatty():
        return None

    def show(index: int, count: int, elapsed: float) -> None:
        print(f"\r{prefix}: cell {index} ({count} code cells), {elapsed:.0f} s  ", end="", flush=True)
    return show


def stage(out: Path, chapters: list[str], keep: dict[str, dict] | None = None
          ) -> tuple[dict[str, dict], list[ChapterFailure]]:
    """Write the book's sources, with executed and stripped notebooks, under ``out/stage``;
    returns each chapter's timings and the chapters that failed to run. ``keep``: the timings of
    chapters staged by an earlier build whose pages stay as they are (one chapter rebuilt into an
    existing book); without it the stage is made anew."""
    root = config.root()
    stage_dir = out / "stage"
    if keep is None:
        shutil.rmtree(stage_dir, ignore_errors=True)
    for old in ("book", "_extra/mathjax", *(f"{where}/{c}" for c in chapters
                                           for where in ("notebooks", "_extra/notebooks"))):
        shutil.rmtree(stage_dir / old, ignore_errors=True)
    shutil.copytree(root / "book", stage_dir / "book")
    shutil.copy2(root / "_toc.yml", stage_dir / "_toc.yml")

    # Build-only settings: serve MathJax and the student notebooks from the site itself.
    cfg = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    sphinx_cfg = cfg.setdefault("sphinx", {}).setdefault("config", {})
    sphinx_cfg["html_extra_path"] = ["_extra"]
    sphinx_cfg["mathjax_path"] = "../mathjax/tex-chtml.js"  # relative to _static/: site root
    shutil.copytree(mathjax_dir(), stage_dir / "_extra" / "mathjax")

    timings, failures = dict(keep or {}), []
    for n, chapter in enumerate(chapters, 1):
        src = config.solution_path(chapter)
        prefix = f"[{n}/{len(chapters)}] {chapter}"
        print(f"{prefix}: executing {src.relative_to(root)}", flush=True)
        try:
            run = measure(chapter, on_cell=_progress(prefix))
        except NotebookFailed as e:
            unexecuted = notebook.read(src)
            failures.append(failure(chapter, unexecuted, e))
            run = Run(failed_page(unexecuted, failures[-1]), 0.0, {}, [])
        cell_s, index = slowest_cell(run.nb)
        timings[chapter] = {"seconds": round(run.seconds, 1), "cpu_seconds": round(run.cpu_seconds, 1),
                            "slowest_cell": index, "slowest_cell_seconds": round(cell_s, 1),
                            "most_cpu_cell_seconds": round(max(run.cell_cpu.values(), default=0.0), 1),
                            "failed": run.seconds == 0.0, "figure_problems": run.figure_problems}
        if sys.stdout.isatty():
            print("\r", end="")
        if timings[chapter]["failed"]:
            print(f"{prefix}: FAILED: {failures[-1].where}: {failures[-1].error}", flush=True)
        else:
            print(f"{prefix}: {run.seconds:.1f} s, {run.cpu_seconds:.0f} CPU seconds; slowest cell "
                  f"{cell_s:.1f} s (cell {index})", flush=True)
        for line in budget_warnings(chapter, timings[chapter]):
            print(f"  WARNING: {line}; the page is built all the same", flush=True)
        target = stage_dir / "notebooks" / chapter
        shutil.copytree(src.parent, target, ignore=shutil.ignore_patterns("*.ipynb", ".*"))
        page = hide_install_cell(drop_widgets(strip_answers(run.nb)))
        nbformat.write(page, str(target / f"{chapter}.ipynb"))
        download = stage_dir / "_extra" / "notebooks" / chapter
        download.mkdir(parents=True)
        shutil.copy2(config.student_path(chapter), download / f"{chapter}.ipynb")
    cfg.setdefault("parse", {})["myst_substitutions"] = substitutions(timings)
    (stage_dir / "_config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return timings, failures


def build(chapters: list[str] | None = None) -> tuple[Path, list[ChapterFailure]]:
    """Stage and build the book; returns the HTML folder (``_build/html``) and the chapters that
    failed to run (built with a page that says so). ``chapters``: rebuild only these into the
    book an earlier build staged (``make book CHAPTER=NN``); None: every chapter, anew."""
    out = config.root() / "_build"
    keep = None
    if chapters is not None:
        timings_file = out / "timings.json"
        keep = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
        missing = [c for c in config.chapters() if c not in chapters
                   and (c not in keep or not (out / "stage" / "notebooks" / c).is_dir())]
        if missing:
            raise SystemExit(f"No earlier build of {', '.join(missing)} to keep: run make book (every "
                             "chapter) once, then rebuild one chapter with make book CHAPTER=NN.")
    timings, failures = stage(out, config.chapters() if chapters is None else chapters, keep)
    (out / "timings.json").write_text(json.dumps(timings, indent=2) + "\n")
    shutil.rmtree(out / "html", ignore_errors=True)
    cmd = [
        str(Path(sys.executable).parent / "jupyter-book"), "build", str(out / "stage"),
        "--path-output", str(out.parent), "-W", "-n", "--keep-going",
    ]
    print("Building the HTML (Sphinx) ...", flush=True)
    subprocess.run(cmd, check=True)  # jupyter-book writes <path-output>/_build/html
    return out / "html", failures
