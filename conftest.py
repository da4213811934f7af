"""pytest set-up shared by the test suite and by `pytest --nbval-lax NOTEBOOK` runs."""


def pytest_configure(config):
    # One per-cell time limit (_config.yml: execute.timeout) instead of nbval's default 2000 s.
    if getattr(config.option, "nbval_cell_timeout", None) == 2000:
        from course_lib.grading import config as course

        config.option.nbval_cell_timeout = course.cell_timeout()
