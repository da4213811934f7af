"""Numbers the prose of a page quotes, taken from the page's own run.

A code cell that measures something (a loss, a time, a ratio) hands it to the prose with
``glue.text("gpt_loss", loss, ".2f")``, and a markdown cell of the same notebook quotes it as
``{glue:text}`gpt_loss```. The book build executes the notebook, and myst-nb pastes the value
of that run into the page, so the text cannot drift from the output beside it. The output is the
one myst-nb's own ``glue(..., display=False)`` writes (a hidden ``application/papermill.record``
bundle), made here so that a student's notebook needs no myst-nb (Colab has none); it shows
nothing in Jupyter.

The build also records every glued value of a chapter (:func:`read`, :func:`write`), and
releasing the student notebook writes the recorded values in place of the roles, as plain text
(:mod:`.markup`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import config

PREFIX = "application/papermill.record/"
ROLE = re.compile(r"\{glue:text\}`([^`]+)`")  # {glue:text}`name`; text() formats, so no ":spec"
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


def values(nb) -> dict[str, str]:
    """``{name: text}`` glued by the outputs of an executed notebook."""
    found = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            meta = output.get("metadata", {}).get("scrapbook")
            if meta and PREFIX + "text/plain" in output.get("data", {}):
                found[meta["name"]] = output["data"][PREFIX + "text/plain"]
    return found


def used(nb) -> list[str]:
    """The names the markdown cells of a notebook quote, in order, each once."""
    names = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            names += [n for n in ROLE.findall(cell.source) if n not in names]
    return names


def record_path(chapter: str) -> Path:
    """The committed record of the values the student notebook of ``chapter`` quotes."""
    return config.root() / "book" / "measured" / f"{chapter}.json"


def build_path(chapter: str) -> Path:
    """The values the last book build glued for ``chapter``."""
    return config.root() / "_build" / "glue" / f"{chapter}.json"


def write(path: Path, found: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(found.items())), indent=1, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def read(path: Path) -> dict[str, str]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
