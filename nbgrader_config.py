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
