"""Numbers the prose of a page quotes, taken from the page's own run.

A code cell that measures something (a loss, a time, a ratio) hands it to the prose with
``glue.text("gpt_loss", loss, ".2f")``, and a markdown cell of the same notebook quotes it as
``{glue:text}`gpt_loss```. The book build executes the notebook, and myst-nb pastes the value
of that run into the page, so the text cannot drift from the output beside it. The output is the
one myst-nb's own ``glue(..., display=False)`` writes (a hidden ``application/papermill.record``
bundle), made here so that a student's notebook needs no myst-nb (Colab has none); it shows
nothing in Jupyter.

The book build records what was glued (:mod:`course_tools.book.glue_records`).
"""

from __future__ import annotations

import re

PREFIX = "application/papermill.record/"
NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def text(name: str, value, fmt: str = "") -> None:
    """Glue ``format(value, fmt)`` under ``name`` for the prose. Returns nothing, so that a call
    on a cell's last line adds no output (the book would wrap it in the cell's figure)."""
    if not NAME.match(name):
        raise ValueError(f"glue name {name!r}: use lower-case letters, digits and _")
    shown = format(value, fmt)
    try:
        from IPython.display import display
    except ImportError:  # plain Python (the graders' runs): nothing to show
        return
    display({PREFIX + "text/plain": shown}, raw=True,
            metadata={"scrapbook": {"name": name, "mime_prefix": PREFIX}})
