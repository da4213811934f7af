"""The code passes ruff (the rules in pyproject.toml)."""

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_is_clean():
    paths = ["course_lib", "tests", "benchmarks", ".ci", "conftest.py", "nbgrader_config.py"]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
