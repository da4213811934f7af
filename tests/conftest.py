from __future__ import annotations

import os
from pathlib import Path

import pytest

from course_tools import config

ROOT = config.root()
CHAPTERS = config.chapters()
IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str):
    """Skip with a reason on a developer's machine; fail in CI, where everything must run."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this must not be skipped)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def html_dir() -> Path:
    html = ROOT / "_build" / "html"
    if not (html / "index.html").is_file():
        pytest.fail("No built book in _build/html: run `make book` first (`make test` does).")
    return html
