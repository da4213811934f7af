"""nbgrader configuration: the repository is the course folder.

solutions/ is the source (instructor notebooks), notebooks/ the release (student notebooks);
collected submissions, autograded copies, feedback and the gradebook live under grading/.
The per-cell time limit comes from _config.yml (execute.timeout), like everywhere else.
"""

from course_lib.grading import config as course

c = get_config()  # noqa: F821 (provided by nbgrader)
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.db_url = "sqlite:///grading/gradebook.db"
c.ExecutePreprocessor.timeout = course.cell_timeout()
c.ClearSolutions.code_stub = {"python": course.CODE_STUB}

# Autograding executes each submission in a sandboxed worker (course_lib.grading.sandbox)
# instead of nbgrader's own Execute; the rest of nbgrader's pipeline is unchanged.
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)

from course_lib.grading.sandbox import SandboxedExecute  # noqa: E402

c.Autograde.autograde_preprocessors = [
    SandboxedExecute,
    IgnorePattern,
    ClearMetadataPreprocessor,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
