"""What went wrong in a grading process, in words a student or an instructor can read, and
without the host's paths (a failure's text reaches grades.csv and the students' feedback).

**Grader side**: runs in the grader's own process, never beside student code.
"""

from __future__ import annotations

import re
import sys
import tempfile
import textwrap
from pathlib import Path

from course_tools import config

# The last line of a traceback: "    nbgrader.api.MissingEntry: No such assignment: 01_x".
EXCEPTION_LINE = re.compile(r"^\s*(?:\w+\.)*([A-Z]\w*)(?::\s*(.*))?$")
# How Python links an exception to the one before it in a log.
CHAINED = {"During handling of the above exception": "while handling",
           "The above exception was the direct cause": "caused by"}
# A path from the root ("/a/b c" gives "/a/b"), without the punctuation that ends a sentence; not
# the "//x" of a URL.
NOT_IN_A_WORD = r"(?<![\w.:/~-])"
PATH_END = r"(?:/[^\s'\"<>]*[^\s'\"<>.,;:!?)\]}])"
ABSOLUTE_PATH = re.compile(NOT_IN_A_WORD + PATH_END)


def failure_cause(log: str, grading_dir: Path, limit: int = 200) -> str:
    """Why an nbgrader run failed, in words, from its output: the last exception's type and
    message (and the one it was raised while handling, if any), else the last line; with every
    absolute path as ``<path>``, cut between words to at most ``limit`` characters."""
    lines = [line for line in log.splitlines() if line.strip()]
    found = [(i, m.groups()) for i, line in enumerate(lines) if (m := EXCEPTION_LINE.match(line))]
    if found:
        end, (name, message) = found[-1]
        cause = f"{name}: {message}" if message else name
        if len(found) > 1:
            start, (name, message) = found[-2]
            between = "\n".join(lines[start:end])
            words = next((w for marker, w in CHAINED.items() if marker in between), None)
            if words:
                cause += f" ({words} {name}: {message})" if message else f" ({words} {name})"
    else:  # a log line without its "[AutogradeApp | ERROR]"
        cause = re.sub(r"^\[[^\]]*\]\s*", "", lines[-1]) if lines else "nbgrader printed nothing"
    return textwrap.shorten(_without_paths(cause, grading_dir), limit, placeholder=" …",
                            break_on_hyphens=False)


def _without_paths(text: str, grading_dir: Path) -> str:
    """``text`` with every absolute path as ``<path>``; the host's own places first, whole, as
    their names may hold spaces."""
    places = {str(p) for p in (grading_dir, config.root(), sys.prefix, sys.base_prefix, Path.home(),
                               tempfile.gettempdir())}
    for place in sorted((p for p in places if len(p) > 1), key=len, reverse=True):
        text = re.sub(NOT_IN_A_WORD + re.escape(place) + r"(?![^\s'\"<>/])" + PATH_END + "?", "<path>", text)
    return ABSOLUTE_PATH.sub("<path>", text)
