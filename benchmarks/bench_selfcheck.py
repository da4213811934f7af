"""Benchmark the students' self-check: one exercise, and a whole chapter, as a student runs them.

Run from the repository root on a quiet machine: ``python benchmarks/bench_selfcheck.py [CHAPTER ...]``.

Each check is the command a student types (``python -m course_tools.student.check NOTEBOOK
[--exercise NAME]``, a fresh process and a fresh kernel), run on the chapter's solution notebook:
a student who has answered everything, so every test runs. For each chapter it times every
exercise alone and the whole notebook once, and compares the whole check with the chapter's
time in the last book build (``_build/timings.json`` when there is one).

The results go to ``book/measured/selfcheck.json``, which the set-up page quotes (as MyST
substitutions, see ``course_tools.book.build.substitutions``) with the machine and the date.
Targets (issue 39): one exercise in at most 5 s, a chapter in at most its book time + 10 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_tools import config, notebook  # noqa: E402
from course_tools.book import build as book  # noqa: E402

EXERCISE_TARGET_S = 5.0
CHAPTER_MARGIN_S = 10.0


def timed_check(path: Path, exercise: str | None = None) -> float:
    cmd = [sys.executable, "-m", "course_tools.student.check", str(path)]
    cmd += ["--exercise", exercise] if exercise else []
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:  # the solution must pass its own self-check
        raise SystemExit(f"self-check of {path.name} {exercise or ''} failed:\n{proc.stdout}{proc.stderr}")
    return seconds


def bench(chapter: str) -> dict:
    path = config.solution_path(chapter)
    names = [ex.name for ex in notebook.exercises(notebook.read(path))]
    exercises = {name: round(timed_check(path, name), 2) for name in names}
    whole = round(timed_check(path), 2)
    slowest, median = max(exercises, key=exercises.get), sorted(exercises.values())[len(names) // 2]
    print(f"{chapter:<18} slowest exercise {exercises[slowest]:5.2f} s ({slowest}), median {median:5.2f} s; "
          f"whole notebook {whole:6.2f} s", flush=True)
    return {"exercises": exercises, "whole": whole}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapters (default: all)")
    args = parser.parse_args(argv)
    chapters = [c for arg in args.chapters or ["all"] for c in config.resolve_chapters(arg)]
    out = book.SELFCHECK_RECORD
    record = json.loads(out.read_text()) if out.exists() else {"chapters": {}}
    record["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    record["date"] = datetime.date.today().isoformat()
    for chapter in chapters:
        record["chapters"][chapter] = bench(chapter)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    timings_file = ROOT / "_build" / "timings.json"
    built = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    slow = [f"{c}: exercise {n} took {s} s" for c in chapters
            for n, s in record["chapters"][c]["exercises"].items() if s > EXERCISE_TARGET_S]
    slow += [f"{c}: whole check {record['chapters'][c]['whole']} s, book {built[c]['seconds']:.1f} s"
             for c in chapters if c in built
             and record["chapters"][c]["whole"] > built[c]["seconds"] + CHAPTER_MARGIN_S]
    print(f"Written to {out.relative_to(ROOT)}.")
    print("\n".join(["Over target:", *slow]) if slow else "Every check within its target.")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
