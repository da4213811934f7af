"""The book checks its own figures: every plot names what its axes measure.

:func:`axis_label_problems` inspects one matplotlib figure. :func:`watch` runs inside the
kernel that executes a chapter for the book: it checks every figure just before it is drawn to
PNG, whichever way it is shown, and :func:`report` prints what it found as one JSON line that
``book.execute`` reads back. Pictures of ideas switch their axes off and are not checked.
"""

from __future__ import annotations

import json

MARKER = "course-figure-check:"
# The two cells ``book.execute`` adds around a notebook: the first starts the check, the last reports.
WATCH_CELL = "import course_tools.book.figures\ncourse_tools.book.figures.watch()"
REPORT_CELL = "course_tools.book.figures.report()"


def _has_data(ax) -> bool:
    return bool(ax.lines or ax.collections or ax.images or ax.patches or ax.containers)


def _labelled(ax, which: str) -> bool:
    """Whether the ``which`` axis of ``ax`` is named: by categories, by its own label, a
    figure-wide one, or, as grids of subplots usually do, by the axes it shares with or one in
    its column (x) or row (y) of the same grid."""
    from matplotlib.category import StrCategoryConverter

    axis = ax.xaxis if which == "x" else ax.yaxis
    if isinstance(axis.get_converter(), StrCategoryConverter):
        return True  # bars of named categories: the tick labels say what each one is
    label = "get_xlabel" if which == "x" else "get_ylabel"
    suplabel = getattr(ax.figure, f"_sup{which}label", None)
    if suplabel is not None and suplabel.get_text().strip():
        return True
    group = ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()
    others = set(group.get_siblings(ax))
    spec = ax.get_subplotspec()
    if spec is not None:
        line = spec.colspan if which == "x" else spec.rowspan
        for other in ax.figure.axes:
            o = other.get_subplotspec()
            if o is not None and o.get_gridspec() is spec.get_gridspec():
                if set(o.colspan if which == "x" else o.rowspan) & set(line):
                    others.add(other)
    return any(getattr(other, label)().strip() for other in others | {ax})


def axis_label_problems(fig) -> list[str]:
    """What is missing: one line per data axes without an x or a y label."""
    problems = []
    for i, ax in enumerate(fig.axes):
        if not (ax.get_visible() and ax.axison) or hasattr(ax, "_colorbar") or not _has_data(ax):
            continue
        name = f"axes {i}" + (f" ({ax.get_title()!r})" if ax.get_title() else "")
        missing = [w for w in ("x", "y") if not _labelled(ax, w)]
        if missing:
            problems.append(f"{name} has no {' or '.join(missing)} label")
    return problems


_found: list[dict] = []


def watch() -> None:
    """Check every figure as it is rendered in this IPython kernel (patches ``print_figure``)."""
    from IPython import get_ipython
    from matplotlib.backend_bases import FigureCanvasBase

    cell = {"source": ""}  # the cell being run: figures are drawn during or just after it
    get_ipython().events.register("pre_run_cell", lambda info: cell.update(source=info.raw_cell))
    original = FigureCanvasBase.print_figure

    def print_figure(canvas, *args, **kwargs):
        for problem in axis_label_problems(canvas.figure):
            _found.append({"source": cell["source"], "problem": problem})
        return original(canvas, *args, **kwargs)

    FigureCanvasBase.print_figure = print_figure


def report() -> None:
    print(MARKER + json.dumps(_found), flush=True)


def read_report(cell) -> list[dict]:
    """What :func:`report` printed in an executed cell (its text may arrive in several parts)."""
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
    line = next(line for line in text.splitlines() if line.startswith(MARKER))
    return json.loads(line.removeprefix(MARKER))
