"""CI's closing table: each stage's seconds beside its budget (.ci/budget.toml), over-budget
stages flagged. A warning, never a failure: machines are noisy.

    python3 .ci/stages.py STAGES_FILE JUNIT_XML

STAGES_FILE has one "name seconds" line per stage that .ci/run timed (apt, install, "make test");
the book's share of "make test" is what pytest's own session time (from the JUnit XML) leaves,
and pytest's time is split by test folder (tests/lib, tests/grading, ...; the files directly under
tests/ count as "tests/*"). Standard library only: it runs even when the install failed.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import tomllib

BUDGET = Path(__file__).with_name("budget.toml")


def folder_of(testcase: ET.Element) -> str:
    """tests/lib for tests.lib.test_bpe (pytest's classname), tests/* for a file directly in tests/."""
    parts = testcase.get("classname", "").split(".")
    return "/".join(parts[:2]) if len(parts) > 2 and parts[0] == "tests" else "tests/*"


def measured(stages_file: Path, junit: Path) -> dict[str, float]:
    seconds: dict[str, float] = {}
    for line in stages_file.read_text().splitlines():
        name, _, value = line.rpartition(" ")
        seconds[name] = float(value)
    make_test = seconds.pop("make test", None)
    if junit.is_file():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        folders: dict[str, float] = defaultdict(float)
        for case in suite.iter("testcase"):
            folders[folder_of(case)] += float(case.get("time", 0))
        session = float(suite.get("time", 0))
        if make_test is not None:
            seconds["book"] = max(make_test - session, 0.0)
        seconds.update(sorted(folders.items()))
        seconds["pytest (collection, other)"] = max(session - sum(folders.values()), 0.0)
    elif make_test is not None:
        seconds["make test (book and tests; no JUnit report)"] = make_test
    return seconds


def table(seconds: dict[str, float], budget: dict) -> tuple[str, int]:
    stages = budget["stages"]
    rows, over = [f"{'stage':32s} {'seconds':>8s} {'budget':>8s}"], 0
    order = [name for name in stages if name in seconds] + [name for name in seconds if name not in stages]
    for name in order:
        s = seconds[name]
        limit = stages.get(name)
        flag = ""
        if limit is not None and s > limit:
            flag, over = "  OVER BUDGET", over + 1
        rows.append(f"{name:32s} {s:8.0f} {'' if limit is None else f'{limit:8.0f}'}{flag}")
    total, limit = sum(seconds.values()), 60 * budget["total_minutes"]
    rows.append(f"{'total':32s} {total:8.0f} {limit:8.0f}" + ("  OVER BUDGET" if total > limit else ""))
    return "\n".join(rows), over + (total > limit)


def main(argv: list[str]) -> int:
    budget = tomllib.loads(BUDGET.read_text())
    text, over = table(measured(Path(argv[1]), Path(argv[2])), budget)
    print("\nWhere CI's time went (budget: .ci/budget.toml)\n" + text)
    if over:
        print(f"warning: {over} stage(s) over budget: find what made them slower (not a failure)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
