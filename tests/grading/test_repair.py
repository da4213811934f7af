"""repair(): a submission's nbgrader metadata becomes the release's again, with a note per repair.

Every case starts from chapter 02's release with every exercise answered, breaks one thing a
student could break (in the file's JSON, where nothing stops them), and checks that each
nbgrader block of the result is the release's, that the notebook passes nbgrader's own metadata
validation (whose failure used to cost the whole notebook its points), and what the note says.
"""

from __future__ import annotations

import copy

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell
from nbgrader.nbgraderformat import MetadataValidator

from course_tools import config, notebook
from course_tools.grading.grader.repair import repair
from tests.helpers import answered

CHAPTER = "02_attention"


@pytest.fixture(scope="module")
def release():
    return notebook.read(config.student_path(CHAPTER))


@pytest.fixture(scope="module")
def _answered():
    return answered(CHAPTER)


@pytest.fixture
def submission(_answered):
    return copy.deepcopy(_answered)


def _blocks(nb) -> list[tuple[str, dict]]:
    """(cell type, nbgrader block) of every cell that has one, in order."""
    return [(c.cell_type, c.metadata["nbgrader"]) for c in nb.cells if "nbgrader" in c.metadata]


def _cell(nb, grade_id: str):
    return next(c for c in nb.cells if notebook.nbgrader_meta(c).get("grade_id") == grade_id)


def _assert_release_metadata(nb, release):
    assert _blocks(nb) == _blocks(release)
    MetadataValidator().validate_nb(nb)  # what nbgrader's CheckCellMetadata runs


def test_an_untouched_submission_needs_no_repair(submission, release):
    repaired, notes = repair(submission, release)
    assert notes == []
    assert repaired == submission


def test_a_test_cell_marked_ungraded_is_graded_again(submission, release):
    _cell(submission, "ex_causal_mask_test").metadata.nbgrader["grade"] = False
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert notes == ["the test cell ex_causal_mask_test had grade False instead of True; "
                     "restored from the release"]


def test_changed_points_are_restored(submission, release):
    _cell(submission, "ex_rope_test").metadata.nbgrader["points"] = 300
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert len(notes) == 1 and "ex_rope_test" in notes[0] and "points 300 instead of 3.0" in notes[0]


def test_an_invented_graded_cell_becomes_a_plain_cell(submission, release):
    bonus = new_code_cell("print('free points')")
    bonus.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": False, "points": 100,
                                  "grade_id": "ex_bonus", "schema_version": 3, "task": False}
    submission.cells.insert(17, bonus)
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert repaired.cells[17].source == "print('free points')"  # still there, worth nothing
    assert len(notes) == 1 and "'ex_bonus'" in notes[0] and "100" in notes[0]


def test_an_invented_answer_cell_is_not_given_an_id_nobody_lost(submission, release):
    extra = new_code_cell("x = 1")
    extra.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                  "grade_id": "ex_mine", "schema_version": 3, "task": False}
    submission.cells.insert(30, extra)
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert len(notes) == 1 and "'ex_mine'" in notes[0]


def test_a_renamed_answer_cell_gets_its_id_back(submission, release):
    answer = _cell(submission, "ex_repeat_kv")
    answer.metadata.nbgrader["grade_id"] = "ex_repeat_kv_v2"
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert _cell(repaired, "ex_repeat_kv").source == answer.source
    assert len(notes) == 1 and "ex_repeat_kv" in notes[0] and "renamed 'ex_repeat_kv_v2'" in notes[0]


def test_a_renamed_answer_cell_moved_elsewhere_is_paired_in_order(submission, release):
    answer = _cell(submission, "ex_sinusoidal")
    answer.metadata.nbgrader["grade_id"] = "ex_sinusoidal_moved"
    submission.cells.remove(answer)
    submission.cells.append(answer)
    repaired, notes = repair(submission, release)
    assert _cell(repaired, "ex_sinusoidal").source == answer.source
    assert len(notes) == 1 and "renamed 'ex_sinusoidal_moved'" in notes[0]


@pytest.mark.parametrize("grade_id", ["ex_split_heads_test", "ex_split_heads", "ex_why_sqrt"])
def test_a_deleted_metadata_block_is_restored(submission, release, grade_id):
    """A test cell (recognised by its unchanged source), an answer cell and a written answer
    (each the only cell of its type where the release has it)."""
    cell = _cell(submission, grade_id)
    del cell.metadata["nbgrader"]
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert len(notes) == 1 and grade_id in notes[0] and "lost its nbgrader metadata" in notes[0]


def test_a_test_cell_turned_into_markdown_is_code_again(submission, release):
    cell = _cell(submission, "ex_kv_cache_bytes_test")
    cell.cell_type = "markdown"
    del cell["outputs"], cell["execution_count"]
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    fixed = _cell(repaired, "ex_kv_cache_bytes_test")
    assert fixed.outputs == [] and fixed.execution_count is None
    assert len(notes) == 1 and "cell type 'markdown' instead of 'code'" in notes[0]


@pytest.mark.parametrize("block", ["junk", {"grade": True, "points": 5}, {"grade_id": ["x"], "grade": True}])
def test_malformed_blocks_are_removed_without_a_crash(submission, release, block):
    cell = new_markdown_cell("my notes")
    cell.metadata["nbgrader"] = block
    submission.cells.insert(3, cell)
    repaired, notes = repair(submission, release)
    _assert_release_metadata(repaired, release)
    assert len(notes) == 1 and "cell 4" in notes[0]


def test_the_submission_itself_is_left_unchanged(submission, release):
    _cell(submission, "ex_rope_test").metadata.nbgrader["points"] = 300
    before = copy.deepcopy(submission)
    repaired, _ = repair(submission, release)
    assert submission == before
    assert repaired is not submission


def test_duplicates_are_left_to_nbgraders_deduplication(submission, release):
    """DeduplicateIds keeps the last copy of an id: repair only makes both copies the release's."""
    copied = copy.deepcopy(_cell(submission, "ex_rope_test"))
    copied.metadata.nbgrader["points"] = 50
    submission.cells.insert(3, copied)
    repaired, notes = repair(submission, release)
    tests = [c for c in repaired.cells if notebook.nbgrader_meta(c).get("grade_id") == "ex_rope_test"]
    assert len(tests) == 2
    assert all(c.metadata.nbgrader == _cell(release, "ex_rope_test").metadata.nbgrader for c in tests)
    assert len(notes) == 1 and "points 50" in notes[0]
