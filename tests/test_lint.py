"""The code passes ruff (the rules in pyproject.toml)."""

import shutil
import subprocess

from tests.conftest import ROOT


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str((ROOT / ".venv" / "bin" / "ruff"))
    proc = subprocess.run([ruff, "check", "course_lib", "tests", "benchmarks", "conftest.py",
                           "nbgrader_config.py"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
