"""Runs nbgrader's command line against a course folder.

**Grader side**: runs in the grader's own process, never beside student code.

The repository is the course root (``nbgrader_config.py``): ``solutions/`` is nbgrader's source
folder and ``notebooks/`` its release folder. Everything an instructor collects and grades lives
under a grading folder (``grading/`` by default, ignored by git), so tests can use a temporary one.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from course_tools import config


def course_args(grading_dir: Path | None = None, release_dir: Path | None = None,
                submitted_dir: Path | None = None) -> list[str]:
    g = Path(grading_dir or config.root() / "grading").resolve()
    submitted = Path(submitted_dir or g / "submitted").resolve()
    args = [
        f"--CourseDirectory.root={config.root()}",
        "--CourseDirectory.source_directory=solutions",
        f"--CourseDirectory.submitted_directory={submitted}",
        f"--CourseDirectory.autograded_directory={g / 'autograded'}",
        f"--CourseDirectory.feedback_directory={g / 'feedback'}",
        f"--CourseDirectory.db_url=sqlite:///{g / 'gradebook.db'}",
        f"--ExecutePreprocessor.timeout={config.cell_timeout()}",
        f"--SandboxedExecute.timeout={config.cell_timeout()}",
    ]
    if release_dir is not None:
        args.append(f"--CourseDirectory.release_directory={Path(release_dir).resolve()}")
    return args


def _nbgrader_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with ``extra``, and this interpreter's scripts first on PATH: nbgrader
    calls the `alembic` script by name."""
    scripts = str(Path(sys.executable).parent)
    return {**os.environ, **(extra or {}), "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")])}


def run(step: str, chapter: str, *extra: str, grading_dir=None, release_dir=None,
        submitted_dir=None) -> None:
    """``nbgrader STEP CHAPTER ...`` with the course's folders; raises if nbgrader fails."""
    g = Path(grading_dir or config.root() / "grading")
    g.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "nbgrader", step, chapter,
           *course_args(g, release_dir, submitted_dir), *extra]
    env = _nbgrader_env()
    proc = subprocess.run(cmd, cwd=config.root(), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {step} {chapter} failed:\n{proc.stdout}\n{proc.stderr}")


STEPS = {"autograde": "Autograde", "generate_feedback": "GenerateFeedback"}  # step -> nbgrader converter


def each_student(step: str, chapter: str, students: list[str], *extra: str, jobs: int = 1, grading_dir=None,
                 submitted_dir=None, env: dict[str, str] | None = None) -> dict[str, str | None]:
    """``nbgrader STEP CHAPTER`` (a step of :data:`STEPS`) for each of ``students``, ``jobs`` at a
    time, with ``env`` added to the environment; returns, per student, None once done, else
    nbgrader's log of the failure. Each of the ``jobs`` processes loads nbgrader and the course's
    configuration once and takes student after student from a shared queue (a process per
    student spent about 3 s of CPU on loading them)."""
    g = Path(grading_dir or config.root() / "grading")
    g.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "course_tools.grading.grader.nbgrader_cli", step, chapter,
           *course_args(g, None, submitted_dir), *extra]
    todo, results = iter(students), {}
    lock = threading.Lock()
    show = _progress(f"nbgrader {step} {chapter}", len(students))

    def work() -> None:
        with _Student(cmd, f"nbgrader {step} {chapter}", env) as one:
            while True:
                with lock:
                    student = next(todo, None)
                if student is None:
                    return
                results[student] = one.run(student)
                with lock:
                    show(results)

    threads = [threading.Thread(target=work) for _ in range(max(1, min(jobs, len(students))))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    show(results, end=True)
    return results


def _progress(what: str, count: int):
    """A callback that rewrites one terminal line: students done of ``count``, failures so far and
    the time left at the pace so far. Silent when standard output is not a terminal (CI logs)."""
    start = time.monotonic()

    def show(results: dict, end: bool = False) -> None:
        if not sys.stdout.isatty() or not count:
            return
        done, failed = len(results), sum(r is not None for r in results.values())
        left = (time.monotonic() - start) / max(done, 1) * (count - done)
        print(f"\r{what}: {done} of {count} students, {failed} failed, about {left:.0f} s left  ",
              end="\n" if end else "", flush=True)
    return show


class _Student:
    """A process of :func:`each_student` (:func:`_serve`), started again after it dies."""

    def __init__(self, cmd: list[str], what: str, env: dict[str, str] | None = None):
        self.env = _nbgrader_env(env)
        self.cmd, self.what, self.proc = cmd, what, None
        self.log = tempfile.TemporaryFile("w+")  # the process's own output, read if it dies

    def run(self, student: str) -> str | None:
        if self.proc is None or self.proc.poll() is not None:
            self.log.seek(0)
            self.log.truncate()
            self.proc = subprocess.Popen(self.cmd, cwd=config.root(), env=self.env, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log)
        try:
            self.proc.stdin.write(json.dumps(student) + "\n")  # any folder name on one line
            self.proc.stdin.flush()
            answer = json.loads(self.proc.stdout.readline() or "null")
        except (OSError, ValueError):
            answer = None
        if isinstance(answer, dict) and answer.get("student") == student:
            return answer.get("failure")
        self.proc.kill()
        self.proc.wait()
        self.log.seek(0)
        return f"{self.what} stopped (exit status {self.proc.returncode}):\n{self.log.read()[-5000:]}"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # the process ends at the end of its input
            self.proc.wait()
        self.log.close()


def _serve(step: str, argv: list[str]) -> None:
    """The process of :func:`each_student`: nbgrader's command line ``STEP argv`` once, then a
    student id per line on standard input (as a JSON string) and a JSON line per student on
    standard output."""
    import nbgrader.converters
    from nbgrader.apps import NbGraderApp
    from nbgrader.converters.base import NbGraderException

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever else is printed goes to the log, never among the answers
    app = NbGraderApp()
    app.initialize([step, *argv])
    step_app, converter = app.subapp, getattr(nbgrader.converters, STEPS[step])
    step_app.coursedir.assignment_id = argv[0]
    for line in sys.stdin:
        student = json.loads(line)
        step_app.coursedir.student_id = student
        buffer = io.StringIO()
        handler = logging.StreamHandler(buffer)
        handler.setFormatter(logging.Formatter("[%(name)s | %(levelname)s] %(message)s"))
        step_app.log.addHandler(handler)
        failure = None
        try:
            converter(coursedir=step_app.coursedir, parent=step_app).start()
        except NbGraderException:  # its log says why, as nbgrader's command line does
            failure = buffer.getvalue()
        except Exception:  # noqa: BLE001 (any other: the student is not done, and the log says why)
            failure = buffer.getvalue() + traceback.format_exc()
        finally:
            step_app.log.removeHandler(handler)
        answers.write(json.dumps({"student": student, "failure": failure}) + "\n")
        answers.flush()


if __name__ == "__main__":
    if sys.argv[1:2] not in ([step] for step in STEPS):
        sys.exit(f"usage: python -m course_tools.grading.grader.nbgrader_cli {{{','.join(STEPS)}}} CHAPTER "
                 "[nbgrader options] < student ids")
    _serve(sys.argv[1], sys.argv[2:])
