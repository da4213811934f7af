"""pytest set-up shared by the test suite and by `pytest --nbval-lax NOTEBOOK` runs."""

import os


def pytest_configure(config):
    # The kernels nbval starts (and every process the tests start) inherit this: OpenMP threads
    # that sleep instead of spinning while they wait (see course_tools.config.kernel_env).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # One per-cell time limit (_config.yml: execute.timeout) instead of nbval's default 2000 s.
    if getattr(config.option, "nbval_cell_timeout", None) == 2000:
        from course_tools import config as course

        config.option.nbval_cell_timeout = course.cell_timeout()
