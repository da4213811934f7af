"""Benchmark grading a class: the course's sandboxed autograding, and plain nbgrader beside it.

Run from the repository root::

    python benchmarks/bench_grading.py [--chapters 02_attention 03_transformer] [--students 40]
                                       [--jobs 2] [--plain]

For each chapter a class of generated submissions, every one fully answered, is graded into a
fresh grading folder by the course's ``grade.grade`` (metadata repair and flags, then nbgrader's
autograde in ``jobs`` processes, each submission's notebook run in the sandbox for feedback and
each exercise's graded run in a second sandbox, judged against the answer key). The class cycles
through the solution, each mistake of the chapter's mutant catalogue and each correct answer of
its acceptance catalogue, one changed exercise per notebook. The answer key is made in the run,
as on a fresh grading folder.

With ``--plain``, the same class is graded again by plain ``nbgrader autograde``, one process per
student, with nbgrader's own ``Execute`` (every cell, no sandbox), the same number at once.

Prints the wall clock of autograding the class (from ``grade``'s start: the release and the
answer key included), seconds per student and the minutes 200 students would take at that rate
(the fixed part counted once per student too: an upper bound); then, for the course, what
``grade`` spends after autograding: the feedback pages, grades.csv and the summary (plain
nbgrader is not asked for them).
"""

from __future__ import annotations

import argparse
import itertools
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

from course_tools.book import release  # noqa: E402
from course_tools.grading.grader import grade, nbgrader_cli  # noqa: E402
from tests.helpers import acceptance, answered, mutants, write  # noqa: E402

PLAIN_CONFIG = """
from nbgrader.preprocessors import Execute
from course_tools.grading.grader.sandbox import SandboxedExecute
c = get_config()
c.Autograde.autograde_preprocessors = [
    Execute if p is SandboxedExecute else p for p in c.Autograde.autograde_preprocessors]
"""


def make_class(chapter: str, grading: Path, n: int) -> list[str]:
    """``n`` answered notebooks: the solution, then each mutant and each acceptance answer in turn."""
    pairs = itertools.zip_longest(mutants(chapter), acceptance(chapter))
    changes = [None, *(change for pair in pairs for change in pair if change is not None)]
    students = [f"student{i:03d}" for i in range(n)]
    for student, change in zip(students, itertools.cycle(changes)):
        path = grading / "submitted" / student / chapter / f"{chapter}.ipynb"
        write(answered(chapter, mutant=change), path)
    return students


def sandboxed(chapter: str, grading: Path, jobs: int) -> tuple[float, float]:
    """Seconds for ``grade.grade``: autograding, then the feedback pages, grades.csv and summary."""
    original, spent = grade._write_outputs, []

    def timed(*args):
        start = time.perf_counter()
        try:
            return original(*args)
        finally:
            spent.append(time.perf_counter() - start)

    grade._write_outputs = timed
    start = time.perf_counter()
    try:
        grade.grade(chapter, grading, jobs)
    finally:
        grade._write_outputs = original
    return time.perf_counter() - start - spent[0], spent[0]


def plain(chapter: str, grading: Path, students: list[str], jobs: int, config_file: Path) -> float:
    start = time.perf_counter()
    release.generate(chapter, grading / "release", grading_dir=grading)  # as grade.grade does

    def one(student):
        nbgrader_cli.run("autograde", chapter, "--force", f"--CourseDirectory.student_id={student}",
                         f"--config={config_file}", grading_dir=grading)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, students))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapters", nargs="+", default=["02_attention", "03_transformer"])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=grade.usable_cpus())
    parser.add_argument("--plain", action="store_true", help="grade the class with plain nbgrader too")
    args = parser.parse_args()
    print(f"{platform.machine()}, {grade.usable_cpus()} CPUs, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}; {args.students} students, {args.jobs} at once")
    for chapter in args.chapters:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            students = make_class(chapter, tmp / "sandboxed", args.students)
            autograde_s, outputs_s = sandboxed(chapter, tmp / "sandboxed", args.jobs)
            times = {"course": autograde_s}
            if args.plain:
                shutil.copytree(tmp / "sandboxed" / "submitted", tmp / "plain" / "submitted")
                config_file = tmp / "plain_config.py"
                config_file.write_text(PLAIN_CONFIG)
                times["plain nbgrader"] = plain(chapter, tmp / "plain", students, args.jobs, config_file)
        for name, seconds in times.items():
            per = seconds / args.students
            print(f"{chapter} {name}: {seconds:.0f} s, {per:.2f} s a student, "
                  f"200 students in {200 * per / 60:.1f} min", flush=True)
        print(f"{chapter} course, then feedback, grades.csv and summary: {outputs_s:.0f} s, "
              f"{outputs_s / args.students:.2f} s a student", flush=True)


if __name__ == "__main__":
    main()
