"""nbgrader preprocessors the course adds to autograding (see ``nbgrader_config.py``).

**Grader side**: runs in the grader's own process, never beside student code.

nbgrader restores the instructor's locked cells (``OverwriteCells``, with ``add_missing_cells``
on, so deleted test cells come back) and keeps one copy of duplicated ones
(``DeduplicateIds``). :class:`RepairTestCells` runs between the two: it drops the empty metadata
that deduplication leaves on the extra copies (nbgrader 0.9 would otherwise fail on them), and
puts each exercise's test cell right after its answer cell, so a test that a student moved
above the answer still tests the answer.
"""

from __future__ import annotations

from nbgrader.preprocessors import NbGraderPreprocessor

from course_tools import config, notebook


def _grade_id(cell) -> str:
    return notebook.nbgrader_meta(cell).get("grade_id", "")


class RepairTestCells(NbGraderPreprocessor):
    def preprocess(self, nb, resources):
        for cell in nb.cells:
            if cell.metadata.get("nbgrader") == {}:  # a duplicate that DeduplicateIds disowned
                del cell.metadata["nbgrader"]
        tests = {_grade_id(c): c for c in nb.cells
                 if c.cell_type == "code" and _grade_id(c).endswith(config.TEST_SUFFIX)}
        cells = [c for c in nb.cells if _grade_id(c) not in tests]
        for test_id, test in tests.items():
            answer = test_id.removesuffix(config.TEST_SUFFIX)
            where = next((i for i, c in enumerate(cells) if _grade_id(c) == answer), None)
            cells.insert(len(cells) if where is None else where + 1, test)
        nb.cells = cells
        return nb, resources
