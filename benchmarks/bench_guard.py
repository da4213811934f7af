"""Benchmark the guarded kernel against the plain python3 kernel on a real chapter.

Run from the repository root: ``python benchmarks/bench_guard.py [--chapter 02_attention] [--repeats 3]``.

The chapter's solution is executed whole, alternately in the plain kernel and in the guarded one
(``course_lib.grading.guard``, which re-checks the test and set-up cells before each cell runs),
``--repeats`` times each. Prints every time, the medians and their difference: the cost the guard
adds per notebook graded. A timing, so it lives here and not in the tests (a shared machine moves
a 17 s run by more than a second).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.grading import config, guard, notebook  # noqa: E402


def execute(path: Path, kernel: str) -> float:
    nb = notebook.read(path)
    client = NotebookClient(nb, kernel_name=kernel, timeout=120,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute(env={**os.environ, **guard.environment(nb)})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", default="02_attention")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = config.solution_path(args.chapter)
    with tempfile.TemporaryDirectory() as jupyter_path:
        guarded = guard.install_kernelspec(Path(jupyter_path))
        os.environ["JUPYTER_PATH"] = jupyter_path
        seconds = {"plain": [], "guarded": []}
        for _ in range(args.repeats):
            seconds["plain"].append(execute(path, "python3"))
            seconds["guarded"].append(execute(path, guarded))
    for kind, times in seconds.items():
        print(f"{kind:8s} {' '.join(f'{t:6.2f}' for t in times)}  median {statistics.median(times):6.2f} s")
    extra = statistics.median(seconds["guarded"]) - statistics.median(seconds["plain"])
    print(f"the guard adds {extra:+.2f} s to {args.chapter} "
          f"({extra / statistics.median(seconds['plain']):+.1%})")


if __name__ == "__main__":
    main()
