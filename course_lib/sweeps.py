"""A results file that grows one row per finished run, so a long sweep survives interruption
(chapters 06 and 07: ``python -m course_lib.scaling sweep``, ``python -m course_lib.moe_runs train``).

The caller decides which jobs are still to do (those not yet in the file) and how to run one;
:func:`append_rows` runs them in order and appends each row to the CSV as soon as it exists.
:func:`parse_command_line` is the two scripts' shared command line.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "squares.csv"
>>> append_rows(path, ("n", "square"), [2, 3], lambda n: {"n": n, "square": n * n}, progress=False)
[{'n': 2, 'square': 4}, {'n': 3, 'square': 9}]
>>> path.read_text().splitlines()
['n,square', '2,4', '3,9']
"""

from __future__ import annotations

import argparse
import csv
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tqdm.auto import tqdm

__all__ = ["append_rows", "parse_command_line"]


def append_rows(path: str | os.PathLike, columns: Sequence[str], jobs: Iterable, run: Callable[..., dict], *,
                desc: str = "runs", progress: bool = True) -> list[dict]:
    """``run(job)`` for each job, each returned row appended to the CSV at ``path`` (with the
    header first if the file is new) and flushed at once; returns the rows, in order."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new_file = not path.exists()
    jobs = list(jobs)
    rows = []
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        if new_file:
            writer.writeheader()
        for job in tqdm(jobs, desc=desc, disable=not progress):
            rows.append(run(job))
            writer.writerow(rows[-1])
            f.flush()  # a finished run survives an interruption
    return rows


def parse_command_line(prog: str, command: str, help: str, default_csv: Path, quick_csv: str, quick_help: str,
                       argv: list[str] | None = None) -> argparse.Namespace:
    """``prog command [--out PATH] [--quick] [--threads N]``: parses ``argv``, applies
    ``--threads`` and returns the arguments with ``out`` resolved to a Path (``default_csv``, or
    ``quick_csv`` with ``--quick``)."""
    import torch

    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser(command, help=help)
    cmd.add_argument("--out", default=None, help=f"CSV to write or complete (default: {default_csv}; "
                                                  f"with --quick: {quick_csv})")
    cmd.add_argument("--quick", action="store_true", help=quick_help)
    cmd.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.out = Path(args.out or (quick_csv if args.quick else default_csv))
    return args
