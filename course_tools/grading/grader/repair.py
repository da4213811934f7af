"""Put the release's nbgrader metadata back into a submission before it is autograded.

**Grader side**: runs in the grader's own process, never beside student code.

nbgrader trusts more of a submission's metadata than it restores: a test cell marked
``"grade": false`` counts as missing, a graded cell the student invented (or whose id was
renamed) fails validation, and either makes nbgrader give the whole notebook 0. :func:`repair`
makes every nbgrader block one of the release's (the student notebook as handed out):

- a cell whose ``grade_id`` is in the release gets the release's block, word for word, and, if
  that cell is graded or locked, the release's cell type;
- a cell that lost its block, or whose ``grade_id`` is not in the release, takes the id of a
  release cell missing from the submission when it stands where that cell stood (the two
  notebooks are aligned cell by cell): a test or locked cell by its unchanged source, an answer
  cell when it is the only candidate of its type there. Answer cells left over that still say
  ``solution`` take the missing answer ids in order when exactly as many of each type are left;
- any other block is removed: an invented graded cell runs as a plain cell.

Left to nbgrader and ``preprocessors.py``: duplicate ids (``DeduplicateIds`` keeps the last
copy), the sources of locked cells (``OverwriteCells``), test cells deleted outright
(``OverwriteCells.add_missing_cells``) and test cells moved before their answer
(``RepairTestCells``).
"""

from __future__ import annotations

import copy
from difflib import SequenceMatcher

from nbformat import NotebookNode


def _text(value) -> str:
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def _block(cell):
    meta = cell.get("metadata")
    return meta.get("nbgrader") if isinstance(meta, dict) else None


def _grade_id(cell) -> str | None:
    block = _block(cell)
    gid = block.get("grade_id") if isinstance(block, dict) else None
    return gid if isinstance(gid, str) and gid else None


def _kind(block: dict, cell_type: str) -> str:
    if block.get("grade") and not block.get("solution"):
        return "test cell"
    if block.get("solution"):
        return "written answer" if cell_type == "markdown" else "answer cell"
    return "locked cell" if block.get("locked") else "nbgrader cell"


def _could_be_answer(cell) -> bool:
    """A plain cell, or one whose unknown block says ``solution`` (an invented test cell is not)."""
    return not _grade_id(cell) or bool(_block(cell).get("solution"))


def _fixed(block: dict) -> bool:
    """Graded or locked: the cell's type, and for locked ones the source, belong to the release."""
    return bool(block.get("grade") or block.get("locked"))


def _set_cell_type(cell, cell_type: str) -> None:
    if cell_type == "code":
        cell.pop("attachments", None)
        cell["outputs"], cell["execution_count"] = [], None
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)
    cell["cell_type"] = cell_type


def _restore(cell, released) -> list[str]:
    """Give ``cell`` the release cell's block (and type); what differed, for the note."""
    want = released.metadata["nbgrader"]
    have = _block(cell) if isinstance(_block(cell), dict) else {}
    changes = [f"{key} {have.get(key)!r} instead of {want.get(key)!r}"
               for key in sorted(set(want) | set(have), key=str)
               if key != "checksum" and have.get(key) != want.get(key)]
    if not isinstance(cell.get("metadata"), dict):
        cell["metadata"] = NotebookNode()
    cell["metadata"]["nbgrader"] = copy.deepcopy(want)
    if _fixed(want) and cell.get("cell_type") != released.cell_type:
        changes.append(f"cell type {cell.get('cell_type')!r} instead of {released.cell_type!r}")
        _set_cell_type(cell, released.cell_type)
    return changes


def _pair(missing, free, adopted) -> None:
    """Within one stretch where the notebooks differ: which free cell stands for which missing one."""
    free = [c for c in free if id(c) not in adopted]
    for want in [m for m in missing if not m.metadata["nbgrader"].get("solution")]:
        same = [c for c in free if c.get("cell_type") == want.cell_type
                and _text(c.get("source")).strip() == _text(want.source).strip()]
        if same:
            adopted[id(same[0])] = (same[0], want)
            free.remove(same[0])
    for cell_type in ("code", "markdown"):
        wants = [m for m in missing if m.metadata["nbgrader"].get("solution") and m.cell_type == cell_type]
        cands = [c for c in free if c.get("cell_type") == cell_type and _could_be_answer(c)]
        if wants and len(wants) == len(cands):
            adopted.update((id(c), (c, w)) for c, w in zip(cands, wants, strict=True))


def _adopt(nb, release, released) -> dict:
    """Cells of ``nb`` that stand for a release cell missing from it: ``{id(cell): (cell, release cell)}``."""

    def key(cell, known):
        gid = _grade_id(cell)
        return ("id", gid) if gid in known else ("text", cell.get("cell_type"), _text(cell.get("source")))

    present = {_grade_id(c) for c in nb.cells} & released.keys()
    missing = {gid for gid in released if gid not in present}
    adopted: dict = {}
    matcher = SequenceMatcher(None, [key(c, released) for c in release.cells],
                              [key(c, released) for c in nb.cells], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace":
            _pair([c for c in release.cells[i1:i2] if _grade_id(c) in missing],
                  [c for c in nb.cells[j1:j2] if _grade_id(c) not in released], adopted)
    # Renamed answer cells that the alignment could not place: pair in order, type by type.
    taken = {_grade_id(w) for _, w in adopted.values()}
    for cell_type in ("code", "markdown"):
        renamed = [c for c in nb.cells if id(c) not in adopted and c.get("cell_type") == cell_type
                   and _grade_id(c) and _grade_id(c) not in released and _block(c).get("solution")]
        wants = [c for c in release.cells if _grade_id(c) in missing - taken and c.cell_type == cell_type
                 and c.metadata["nbgrader"].get("solution")]
        if wants and len(wants) == len(renamed):
            adopted.update((id(c), (c, w)) for c, w in zip(renamed, wants, strict=True))
    return adopted


def repair(submission: NotebookNode, release: NotebookNode) -> tuple[NotebookNode, list[str]]:
    """A copy of ``submission`` whose nbgrader metadata is the release's, and one note per repair.

    A test cell set to ``"grade": false`` -> ``"grade": true`` again, with the note
    ``"the test cell ex_foo_test had grade False instead of True; restored from the release"``;
    an untouched submission -> an equal copy and ``[]``. Pure: reads and writes no file.
    """
    nb = copy.deepcopy(submission)
    released = {gid: cell for cell in release.cells if (gid := _grade_id(cell))}
    notes = []
    adopted = _adopt(nb, release, released)
    for number, cell in enumerate(nb.cells, start=1):
        block, gid = _block(cell), _grade_id(cell)
        if id(cell) in adopted:
            want = adopted[id(cell)][1]
            how = f"was renamed {gid!r}" if gid else "had lost its nbgrader metadata"
            _restore(cell, want)
            notes.append(f"the {_kind(want.metadata['nbgrader'], want.cell_type)} {_grade_id(want)} "
                         f"(cell {number}) {how}; restored from the release")
        elif gid in released:
            changes = _restore(cell, released[gid])
            if changes:
                kind = _kind(released[gid].metadata["nbgrader"], released[gid].cell_type)
                notes.append(f"the {kind} {gid} had {', '.join(changes)}; restored from the release")
        elif block is not None:
            del cell["metadata"]["nbgrader"]
            if block != {}:  # an empty block is what DeduplicateIds leaves on a copy: no news
                block = block if isinstance(block, dict) else {}
                what = _kind(block, cell.get("cell_type"))
                points = f" worth {block['points']!r} points" if block.get("points") else ""
                name = repr(gid) if gid else "without a valid grade_id"
                notes.append(f"cell {number}: a {what} {name}{points} is not in the release; "
                             "graded as a plain cell")
    return nb, notes
