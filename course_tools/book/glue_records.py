"""The record of what a chapter's page quotes: every value its build glued, kept per chapter.

The book build records every glued value of a chapter (:func:`read`, :func:`write`), and
releasing the student notebook writes the recorded values in place of the roles, as plain text
(:mod:`.markup`). Each record carries the fingerprint of the code that measured it
(:func:`sources`): the solution's code cells and every file of ``course_lib``. Release refuses
a record whose code has changed since (:func:`check_current`), so a student notebook cannot
quote a number that the current code no longer gives. (What a notebook's cell calls to glue a
value is :func:`course_tools.student.glue.text`.)
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from course_tools import config
from course_tools.student.glue import PREFIX

ROLE = re.compile(r"\{glue:text\}`([^`]+)`")  # {glue:text}`name`; text() formats, so no ":spec"


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


class StaleRecord(RuntimeError):
    """Measured values whose code has changed since they were measured."""


def sources(chapter: str) -> str:
    """The fingerprint (SHA-256) of the code that measures ``chapter``'s values: the sources of the
    solution's code cells after the install cell (markdown only quotes values), and the bytes of
    every file under ``course_lib/`` but Python's caches: modules, shipped checkpoints and recorded
    runs alike (the tooling, ``course_tools``, measures nothing a page quotes)."""
    import nbformat  # here, not at the top: a student notebook imports this module without nbformat (Colab)

    digest = hashlib.sha256()
    nb = nbformat.read(str(config.solution_path(chapter)), as_version=4)
    for cell in nb.cells[1:]:
        if cell.cell_type == "code":
            digest.update(b"cell\0" + cell.source.encode("utf-8") + b"\0")
    library = config.root() / "course_lib"
    for path in sorted(library.rglob("*")):
        rel = path.relative_to(library)
        if path.is_file() and "__pycache__" not in rel.parts:
            digest.update(b"file\0" + rel.as_posix().encode("utf-8") + b"\0" + path.read_bytes())
    return digest.hexdigest()


def write(path: Path, found: dict[str, str], measured_with: str) -> None:
    """Record ``found`` with the fingerprint of the code that measured it (:func:`sources`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"sources": measured_with, "values": dict(sorted(found.items()))}
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read(path: Path) -> dict[str, str]:
    """The values of a record (empty if there is none)."""
    return _load(path).get("values", {})


def measured_with(path: Path) -> str | None:
    """The fingerprint a record was measured with (None: no record, or one without it)."""
    return _load(path).get("sources")


def check_current(path: Path, chapter: str) -> None:
    """Raise :class:`StaleRecord` unless the record at ``path`` was measured by the current code."""
    if measured_with(path) != sources(chapter):
        raise StaleRecord(
            f"{path.name}: the values of {chapter} were measured by code that has changed since (its "
            f"solution's code cells or course_lib); run the chapter again with `make book "
            f"CHAPTER={chapter}` (after one full `make book`), then `make release CHAPTER={chapter}`")
