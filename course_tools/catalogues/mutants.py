"""The graders' self-test: wrong answers must fail, correct answers written differently must pass,
and every verdict must be the same on every machine.

Two catalogues per chapter, in the same format:

- ``mutants/NN_name.yaml`` (beside this module): plausible **wrong** answers. Each entry is
  ``{grade_id: ex_<name>, find: ..., replace: ..., why: ..., hint: ...}``: the exercise's solution
  cell with ``find`` replaced by ``replace``, or ``{grade_id, answer, why, hint}`` with ``answer``
  the whole code between the cell's solution markers; ``why`` names the mistake for instructors,
  ``hint`` is what a student whose answer makes it reads (:mod:`.mistakes`). A mutant is *killed*
  if its tests raise; the kill rate must be at least 90%.
- ``acceptance/NN_name.yaml``: **correct** answers written the way students write them and
  differently from the reference, entries of either form. Any failure is a false reject, and the
  false-reject rate must be 0.

Grading runs in one worker process per chapter, without a kernel per answer: the set-up cells
run once, then each answer and its exercise's full tests (hidden ones included) run in a copy of
the set-up namespace, with a time limit. The reference solutions are graded first, as answers
like any other. Before each answer the global random state is reset to a seed that differs
between runs of the matrix, so a test that draws from it instead of its own generator is caught.

The **matrix** stands in for other machines on this one: 1 and 2 threads, each on the CPU kernels
torch and MKL pick here and on the portable ones they can be forced to (``ATEN_CPU_CAPABILITY=
default``, ``MKL_CBWR=COMPATIBLE``, ``ONEDNN_MAX_CPU_ISA=SSE41``). Every verdict must agree.

The **visible tests** alone (the test cells as students get them, hidden blocks removed) are
also run on every answer, in one setting: the share of mutants they catch says how far a PASS in
the students' self-check predicts the grade (at least 90% per chapter), and a correct
answer they reject is a false reject too.

    python -m course_tools.catalogues.mutants 01_tokenization      # one chapter, this machine as it is
    python -m course_tools.catalogues.mutants all --matrix         # every chapter under the matrix
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from course_tools import config, notebook

KILL_RATE_TARGET = 0.9
VISIBLE_CATCH_TARGET = 0.90  # share of mutants the visible tests alone must catch (the self-check)
MIN_PER_EXERCISE = 10  # plausible wrong answers per exercise
MIN_ACCEPTED_PER_EXERCISE = 4  # correct answers written differently, per exercise
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
FOLDER = Path(__file__).resolve().parent  # mutants/, acceptance/, unseen_mistakes/: a YAML file per chapter
KINDS = ("reference", "acceptance", "mutant")

# name -> (threads, environment); the global seed of each run is its position in this table.
_PORTABLE = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"}
MATRIX: dict[str, tuple[int, dict[str, str]]] = {
    "2 threads, native kernels": (2, {}),
    "1 thread, native kernels": (1, {}),
    "2 threads, portable kernels": (2, _PORTABLE),
    "1 thread, portable kernels": (1, _PORTABLE),
}


@dataclass(frozen=True)
class Verdict:
    kind: str  # "reference" | "acceptance" | "mutant"
    grade_id: str
    why: str
    failed: bool  # the tests raised: right for a mutant, a false reject otherwise
    detail: str
    visible_failed: bool | None = None  # the visible tests alone raised (None: not run)

    @property
    def right(self) -> bool:
        """The grader did the right thing with this answer."""
        return self.failed == (self.kind == "mutant")


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _run(code: str, namespace: dict, seconds: int) -> str:
    """Exec ``code``; returns '' on success or the error's name and message."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        exec(compile(code, "<exercise>", "exec"), namespace)
        return ""
    except _Timeout:
        return f"timed out after {seconds} s"
    except BaseException as e:  # noqa: BLE001 (a wrong answer may raise anything, SystemExit too)
        return f"{type(e).__name__}: {e}"[:300]
    finally:
        signal.alarm(0)


def catalogue_path(chapter: str, kind: str = "mutant") -> Path:
    folder = {"mutant": "mutants", "acceptance": "acceptance"}[kind]
    return FOLDER / folder / f"{chapter}.yaml"


def load_catalogue(chapter: str, kind: str) -> list[dict]:
    import yaml

    path = catalogue_path(chapter, kind)
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} catalogue for {chapter}: {path}")
    return yaml.safe_load(path.read_text(encoding="utf-8")) or []


def apply(entry: dict, solution: str) -> str:
    """The solution cell with a catalogue entry applied (find/replace, or a whole new answer)."""
    if "answer" in entry:
        start, end = solution.find(SOLUTION_BEGIN), solution.find(SOLUTION_END)
        if start < 0 or end < start:
            raise ValueError(f"{entry['why']!r}: the solution of {entry['grade_id']} has no solution markers")
        indent = solution[solution.rfind("\n", 0, start) + 1:start]
        body = "".join(indent + line if line.strip() else line
                       for line in entry["answer"].rstrip("\n").splitlines(keepends=True))
        return solution[:start] + SOLUTION_BEGIN + "\n" + body + "\n" + indent + solution[end:]
    if entry["find"] not in solution:
        raise ValueError(f"{entry['why']!r}: {entry['find']!r} is not in {entry['grade_id']}'s solution")
    return solution.replace(entry["find"], entry["replace"], 1)


def _reseed(seed: int) -> None:
    import numpy as np
    import torch

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def grade_in_process(chapter: str, seed: int = 0, visible: bool = False) -> list[Verdict]:
    """Grade the references and both catalogues of ``chapter`` in this process (the worker's body);
    with ``visible``, also grade each answer by the visible tests alone."""
    import matplotlib

    matplotlib.use("Agg")
    nb = notebook.read(config.solution_path(chapter))
    exercises = {ex.name: ex for ex in notebook.exercises(nb)}
    timeout = config.cell_timeout()
    base: dict = {"__name__": "__main__"}
    for i in notebook.setup_cells(nb):
        error = _run(nb.cells[i].source, base, timeout)
        if error:
            raise RuntimeError(f"set-up cell {i} of {chapter} failed: {error}")
    answers = [("reference", {"grade_id": name, "why": "the reference solution"}) for name in exercises]
    answers += [("acceptance", e) for e in load_catalogue(chapter, "acceptance")]
    answers += [("mutant", e) for e in load_catalogue(chapter, "mutant")]
    verdicts = []
    for index, (kind, entry) in enumerate(answers):
        ex = exercises.get(entry["grade_id"])
        if ex is None:
            raise ValueError(f"{kind} entry for unknown exercise {entry['grade_id']!r} in {chapter}")
        solution = nb.cells[ex.solution_cell].source
        code = solution if kind == "reference" else apply(entry, solution)
        tests = nb.cells[ex.test_cell].source
        _reseed(1000 * seed + index)
        error = _run(code + "\n" + tests, dict(base), timeout)
        seen = None
        if visible:
            _reseed(1000 * seed + index)
            seen = bool(_run(code + "\n" + notebook.hide_blocks(tests), dict(base), timeout))
        verdicts.append(Verdict(kind, ex.name, entry["why"], bool(error), error, seen))
    return verdicts


def _answers(chapter: str, nb) -> list[tuple[str, dict, str]]:
    """(kind, entry, answer cell) for the references and both catalogues, in grading order."""
    exercises = {ex.name: ex for ex in notebook.exercises(nb)}
    entries = [("reference", {"grade_id": name, "why": "the reference solution"}) for name in exercises]
    entries += [("acceptance", e) for e in load_catalogue(chapter, "acceptance")]
    entries += [("mutant", e) for e in load_catalogue(chapter, "mutant")]
    out = []
    for kind, entry in entries:
        ex = exercises.get(entry["grade_id"])
        if ex is None:
            raise ValueError(f"{kind} entry for unknown exercise {entry['grade_id']!r} in {chapter}")
        solution = nb.cells[ex.solution_cell].source
        out.append((kind, entry, solution if kind == "reference" else apply(entry, solution)))
    return out


def run_recorded(chapter: str, nb, answers: list[tuple[str, str]], timeout: float = 600) -> list[dict]:
    """Each ``(grade_id, answer cell)`` of ``answers`` recorded by the tests of ``nb`` (the solution
    notebook, or the student's for the visible tests) the way submissions are: by the runner of
    :mod:`verdicts`, all in one child process (not in the sandbox: the catalogues are the
    instructor's code). Returns the records in the order of ``answers``."""
    from course_tools.grading.grader import verdicts

    by_name = {ex["name"]: ex for ex in verdicts.request(nb)["exercises"]}
    req = verdicts.request(nb) | {"batch": True, "exercises": [
        dict(by_name[name], name=f"{i} {name}", answer=code) for i, (name, code) in enumerate(answers)]}
    results = verdicts.run_elsewhere(req, timeout=timeout, cwd=str(config.solution_path(chapter).parent))
    return [results.get(f"{i} {name}") or {} for i, (name, _) in enumerate(answers)]


def grade(chapter: str, setting: str | None = None, visible: bool = False) -> list[Verdict]:
    """Grade ``chapter`` in a fresh worker process, under one setting of ``MATRIX`` (default: as is)."""
    cmd = [sys.executable, "-m", __name__, chapter, "--json"] + ["--visible"] * visible
    env = dict(os.environ)
    if setting is not None:
        threads, extra = MATRIX[setting]
        cmd += ["--threads", str(threads), "--seed", str(list(MATRIX).index(setting))]
        env.update(extra, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          cwd=config.solution_path(chapter).parent)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"grader self-test worker for {chapter} ({setting or 'as is'}) failed:\n"
                           f"{proc.stderr[-3000:]}")
    return [Verdict(**v) for v in json.loads(proc.stdout.strip().splitlines()[-1])]


def grade_matrix(chapter: str, jobs: int = 2, visible: bool = False) -> dict[str, list[Verdict]]:
    """Grade ``chapter`` under every setting of ``MATRIX``, ``jobs`` workers at a time (with
    ``visible``, the visible tests run in the first setting)."""
    first = next(iter(MATRIX))
    with ThreadPoolExecutor(jobs) as pool:
        runs = pool.map(lambda s: grade(chapter, s, visible and s == first), MATRIX)
        return dict(zip(MATRIX, runs, strict=True))


def disagreements(runs: dict[str, list[Verdict]]) -> list[str]:
    """Answers whose verdict is not the same in every run of the matrix."""
    out = []
    for row in zip(*runs.values(), strict=True):
        if len({v.failed for v in row}) > 1:
            first = row[0]
            where = ", ".join(f"{name}: {'fail' if v.failed else 'pass'}"
                              for name, v in zip(runs, row, strict=True))
            out.append(f"{first.kind} {first.grade_id} ({first.why}): {where}")
    return out


@dataclass(frozen=True)
class Summary:
    chapter: str
    accepted_cases: int  # references and acceptance entries
    false_rejects: list[str]
    mutants: int
    survivors: list[str]
    visible_seen: int = 0  # mutants the visible tests alone were run on
    visible_misses: tuple[str, ...] = ()  # those of them only the hidden tests fail

    @property
    def visible_catch(self) -> float | None:
        """Share of mutants the visible tests alone fail (None: not run)."""
        return 1 - len(self.visible_misses) / self.visible_seen if self.visible_seen else None

    @property
    def kill_rate(self) -> float:
        return 1 - len(self.survivors) / max(self.mutants, 1)

    @property
    def ok(self) -> bool:
        return (not self.false_rejects and self.kill_rate >= KILL_RATE_TARGET
                and (self.visible_catch is None or self.visible_catch >= VISIBLE_CATCH_TARGET))

    def line(self) -> str:
        return (f"{self.chapter:<18} correct answers {self.accepted_cases:4d}, false rejects "
                f"{len(self.false_rejects):2d} "
                f"({len(self.false_rejects) / max(self.accepted_cases, 1):.0%}); "
                f"mutants {self.mutants:4d}, kill rate {self.kill_rate:5.1%}"
                + ("" if self.visible_catch is None else f", visible tests catch {self.visible_catch:5.1%}"))


def summarize(chapter: str, runs: dict[str, list[Verdict]]) -> Summary:
    """Counts over every run: a correct answer failed in any setting is a false reject, and a
    mutant that survived in any setting is a survivor."""
    correct, wrong, missed, seen_mutants = [], [], [], 0
    for row in zip(*runs.values(), strict=True):
        first = row[0]
        failure = next((v for v in row if v.failed), None)
        seen = [v.visible_failed for v in row if v.visible_failed is not None]
        if first.kind == "mutant":
            wrong.append(None if all(v.failed for v in row) else f"{first.grade_id}: {first.why}")
            seen_mutants += bool(seen)
            missed += [f"{first.grade_id}: {first.why}"] if seen and not any(seen) else []
        elif failure:
            correct.append(f"{first.kind} {first.grade_id} ({first.why}): {failure.detail}")
        elif any(seen):
            correct.append(f"{first.kind} {first.grade_id} ({first.why}): rejected by the visible tests")
        else:
            correct.append(None)
    return Summary(chapter, len(correct), [c for c in correct if c], len(wrong), [w for w in wrong if w],
                   seen_mutants, tuple(missed))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The graders' self-test: mutant and acceptance catalogues.")
    parser.add_argument("chapter", help="a chapter (01_tokenization or 01) or 'all'")
    parser.add_argument("--matrix", action="store_true", help="run under every setting of the matrix")
    parser.add_argument("--misses", action="store_true",
                        help="also list the mutants that only the hidden tests fail")
    parser.add_argument("--json", action="store_true", help="(worker) print the verdicts as JSON")
    parser.add_argument("--visible", action="store_true", help="(worker) also grade by the visible tests")
    parser.add_argument("--threads", type=int, default=None, help="(worker) torch threads")
    parser.add_argument("--seed", type=int, default=0, help="(worker) global seed of this run")
    args = parser.parse_args(argv)
    if args.json:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps([asdict(v) for v in grade_in_process(args.chapter, args.seed, args.visible)]))
        return 0
    failed = False
    for chapter in config.resolve_chapters(args.chapter):
        runs = grade_matrix(chapter, visible=True) if args.matrix else {"as is": grade(chapter, visible=True)}
        summary = summarize(chapter, runs)
        split = disagreements(runs)
        for problem in summary.false_rejects:
            print(f"  FALSE REJECT {problem}")
        for problem in summary.survivors:
            print(f"  SURVIVED     {problem}")
        for problem in split:
            print(f"  DIFFERS      {problem}")
        for problem in summary.visible_misses if args.misses else ():
            print(f"  HIDDEN ONLY  {problem}")
        print(summary.line() + (f"; {len(runs)} settings agree" if len(runs) > 1 and not split else ""),
              flush=True)
        failed |= not summary.ok or bool(split)
    print(f"Targets: no false reject, kill rate at least {KILL_RATE_TARGET:.0%}, visible tests catch at "
          f"least {VISIBLE_CATCH_TARGET:.0%}"
          + (", the same verdicts in every setting." if args.matrix else "."))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
