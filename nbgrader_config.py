"""nbgrader configuration: the repository is the course folder.

solutions/ is the source (instructor notebooks), notebooks/ the release (student notebooks);
collected submissions, autograded copies, feedback and the gradebook live under grading/.
The per-cell time limit comes from _config.yml (execute.timeout), like everywhere else.
"""

import os

import nbgrader
from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from course_tools import config as course
from course_tools.grading.grader.feedback import TEMPLATES, HideTests, NameGrades, SanitizeOutputs
from course_tools.grading.grader.preprocessors import RepairTestCells
from course_tools.grading.grader.sandbox import SandboxedExecute

c = get_config()  # noqa: F821 (provided by nbgrader)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = "sqlite:///grading/gradebook.db"
c.ExecutePreprocessor.timeout = course.cell_timeout()
c.ClearSolutions.code_stub = {"python": course.CODE_STUB}

# Tests a student deleted come back; tests a student moved go back after their answers.
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    ClearOutput,
    DeduplicateIds,
    OverwriteKernelspec,
    RepairTestCells,
    OverwriteCells,
    CheckCellMetadata,
]
# Each submission runs in a sandboxed worker (course_tools.grading.grader.sandbox) instead of nbgrader's
# own Execute; its outputs and markdown are made inert at once, so the autograded notebook that
# the formgrader and the feedback render runs no student script (course_tools.grading.grader.feedback).
c.Autograde.autograde_preprocessors = [
    SandboxedExecute,
    SanitizeOutputs,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
# Feedback goes to students: no hidden test in it (sanitising again costs nothing and covers
# notebooks autograded before SanitizeOutputs existed). Then nbgrader's GetGrades, extended to name
# each grade by its exercise and to mark written answers not graded yet, for the course's page.
c.GenerateFeedback.preprocessors = [
    SanitizeOutputs,
    HideTests,
    NameGrades,
    CSSHTMLHeaderPreprocessor,
]
# The page: course_tools/grading/grader/templates/feedback/course_feedback.html.j2, which extends nbgrader's.
c.HTMLExporter.template_name = "feedback"
c.HTMLExporter.template_file = "course_feedback.html.j2"
c.HTMLExporter.extra_template_basedirs = [
    os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader", "templates"),
    TEMPLATES,
]
