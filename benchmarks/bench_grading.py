"""Benchmark grading a class: the course's sandboxed autograding against plain nbgrader.

Run from the repository root: ``python benchmarks/bench_grading.py [--students 40] [--jobs 2]``.

A class of generated submissions of chapter 02 (right answers, one wrong answer, untouched
notebooks, in turn) is graded twice in the same run, each into a fresh grading folder:

1. the course's ``grade.grade``: metadata repair and flags, then ``nbgrader autograde`` per
   student with each notebook executed in the sandbox (bubblewrap, watchdog) for feedback and each
   exercise's graded run in a second sandbox, judged against the answer key;
2. plain ``nbgrader autograde`` per student, with nbgrader's own ``Execute`` (no sandbox), the
   same number of students at once.

Both exclude feedback and the CSV. Prints seconds per student (wall clock over the class
divided by its size), the ratio and a 200-student estimate.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.grading import grade, nbgrader_cli, release  # noqa: E402
from tests.helpers import answered, mutants, write  # noqa: E402

CHAPTER = "02_attention"
PLAIN_CONFIG = """
from nbgrader.preprocessors import Execute
from course_lib.grading.sandbox import SandboxedExecute
c = get_config()
c.Autograde.autograde_preprocessors = [
    Execute if p is SandboxedExecute else p for p in c.Autograde.autograde_preprocessors]
"""


def make_class(grading: Path, n: int) -> list[str]:
    wrong = mutants(CHAPTER)[0]
    kinds = [lambda: answered(CHAPTER), lambda: answered(CHAPTER, mutant=wrong),
             lambda: answered(CHAPTER, set())]
    students = [f"student{i:03d}" for i in range(n)]
    for i, student in enumerate(students):
        write(kinds[i % 3](), grading / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb")
    return students


def plain(grading: Path, students: list[str], jobs: int, config_file: Path) -> float:
    start = time.perf_counter()
    release.generate(CHAPTER, grading / "release", grading_dir=grading)  # as grade.grade does

    def one(student):
        nbgrader_cli.run("autograde", CHAPTER, "--force", f"--CourseDirectory.student_id={student}",
                         f"--config={config_file}", grading_dir=grading)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, students))
    return time.perf_counter() - start


def sandboxed(grading: Path, jobs: int) -> float:
    start = time.perf_counter()
    original = grade._write_outputs
    grade._write_outputs = lambda chapter, g, students, record: g  # feedback and CSV excluded
    try:
        grade.grade(CHAPTER, grading, jobs)
    finally:
        grade._write_outputs = original
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.students} students of {CHAPTER}, {args.jobs} at once")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config_file = tmp / "plain_config.py"
        config_file.write_text(PLAIN_CONFIG)
        times = {}
        for name in ("sandboxed", "plain"):
            grading = tmp / name
            students = make_class(grading, args.students)
            times[name] = (sandboxed(grading, args.jobs) if name == "sandboxed"
                           else plain(grading, students, args.jobs, config_file))
            shutil.rmtree(grading)
    per = {k: v / args.students for k, v in times.items()}
    print(f"sandboxed: {times['sandboxed']:.0f} s, {per['sandboxed']:.2f} s a student")
    print(f"plain nbgrader: {times['plain']:.0f} s, {per['plain']:.2f} s a student")
    print(f"ratio sandboxed / plain: {times['sandboxed'] / times['plain']:.2f} (target <= 1.3)")
    print(f"200 students, sandboxed: about {200 * per['sandboxed'] / 60:.0f} min")


if __name__ == "__main__":
    main()
