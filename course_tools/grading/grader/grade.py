"""Autograde one chapter for every collected student and write the grades.

**Grader side**: runs in the grader's own process, never beside student code.

Submissions live in ``<grading>/submitted/<student>/<chapter>/<chapter>.ipynb`` (nbgrader's
layout; ``collect`` puts them there and lists every student of the export in its manifest).
Grading

1. refuses to run where no safe sandbox can be made (``sandbox.unavailable``), unless the
   instructor passes ``unsandboxed=True`` (``--unsandboxed``);
2. regenerates the chapter into the gradebook, so a fresh grading folder works;
3. checks every submission first: a folder holding anything but the one regular notebook file, a
   file that is not a notebook, is empty, or belongs to another chapter gets a clear message and
   0 points; tampered nbgrader metadata (a test cell marked ungraded, an invented graded cell,
   changed points or ids) is repaired from the release, with a note; code worth a person's look
   (monkeypatching, interpreter hooks) is flagged, never penalised;
4. autogrades each student with nbgrader, several at a time (``jobs`` processes, each loading
   nbgrader once and grading student after student: :func:`nbgrader_cli.each_student`), from a clean
   copy written under ``<grading>/staged/`` (the submission itself is never changed, so grading
   again gives the same notes), each notebook executed in the sandbox of ``sandbox.py``;
5. writes feedback HTML per student (no hidden tests in it, see ``feedback.py``; a process per CPU),
   the chapter's table ``<grading>/grades/<chapter>.csv`` (one row per student of the export:
   name, LMS id, points per exercise and written question, sums, problem, notes, flags, the known
   mistakes its failed exercises make), its summary per exercise (``grades/<chapter>-summary.txt``
   and ``.png``: scores, and how many students made each known mistake) and the gradebook of every
   chapter graded so far, ``<grading>/gradebook.csv``, for the LMS (see ``gradebook.py``).
   Problems, notes, flags and mistakes are kept in ``<grading>/graded/<chapter>.json`` so that ``export``
   writes the same rows after manual grading.

Whatever one submission holds is that student's problem alone: each step per student (staging,
autograding, reading the graded runs' report, the feedback page) fails alone and says why in the
student's ``problem`` (or, for a missing report, the notes), and text from submissions is written
through ``safe_text`` (lone surrogates replaced, records written whole), so the class is always
graded and a later grading never trips on what an earlier one left.

A class can be graded in N shares on N machines (a Slurm job array, a Kubernetes Indexed Job;
see the instructors' page): ``grade(..., shard=(K, N))`` grades only the students of the K-th
share (:func:`shard_of`, a hash of the student's folder name, which collect keys by the LMS id,
so the shares are the same on every machine and every run) and writes everything it makes under
``<grading>/shards/<chapter>/K-of-N/``, reading nothing there but ``submitted/`` and the collect
manifest: a failed share is graded again alone, touching no other. :func:`merge` then copies
each share's autograded notebooks and gradebook rows into ``<grading>`` and writes the feedback,
the chapter's grades CSV, the summary and ``gradebook.csv`` exactly as one run would have.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import nbformat

from course_tools import config, notebook
from course_tools.book import release
from course_tools.grading.grader import (
    collect,
    flags,
    gradebook,
    mistakes,
    nbgrader_cli,
    repair,
    safe_text,
    sandbox,
    verdicts,
)
from course_tools.grading.grader.failures import failure_cause


def _students(chapter: str, g: Path) -> list[str]:
    """Every student with a folder or in the collect manifest (a row each, whatever happened)."""
    folders = {p.parent.name for p in (g / "submitted").glob(f"*/{chapter}") if p.is_dir()}
    return sorted(folders | set(collect.manifest(chapter, g)["students"]))


def _record_path(chapter: str, g: Path) -> Path:
    return g / "graded" / f"{chapter}.json"


def shard_of(student: str, n: int) -> int:
    """The share (1 to ``n``) that grades ``student``: the same on every machine and every run."""
    return int.from_bytes(hashlib.sha256(student.encode("utf-8")).digest()[:8], "big") % n + 1


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/8"`` -> (2, 8), with a message a person can act on for anything else."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise SystemExit(f"--shard takes K/N, e.g. 2/8 (the second of eight shares), got {text!r}") from None
    if not 1 <= k <= n:
        raise SystemExit(f"--shard K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def shard_dir(chapter: str, g: Path, k: int, n: int) -> Path:
    return g / "shards" / chapter / f"{k}-of-{n}"


def grade(chapter: str, grading_dir: Path | None = None, jobs: int | None = None,
          unsandboxed: bool = False, all_cells: bool = False, shard: tuple[int, int] | None = None) -> Path:
    """Autograde ``chapter``; returns the path of its grades CSV (with ``shard=(K, N)``: of the
    share's record, for :func:`merge`). The chapter's unchanged demonstration cells
    (:func:`notebook.unchanged_demonstrations`) are not run unless ``all_cells``."""
    g = Path(grading_dir or config.root() / "grading").resolve()
    why = sandbox.unavailable()
    if why and not unsandboxed:
        raise SystemExit(f"Refusing to grade: {why}.\nEvery submission's code would run with your "
                         "rights. Pass --unsandboxed (make grade UNSANDBOXED=1) only for work you trust.")
    students = _students(chapter, g)
    if not students:
        raise SystemExit(f"No submissions of {chapter} under {g / 'submitted'}/<student>/{chapter}/")
    out = g  # where everything this run makes goes: a share writes only its own folder
    if shard is not None:
        out = shard_dir(chapter, g, *shard)
        shutil.rmtree(out, ignore_errors=True)  # a share graded again starts afresh
        students = [s for s in students if shard_of(s, shard[1]) == shard[0]]
    collected = collect.manifest(chapter, g)["students"]
    released = release.generate(chapter, out / "release", grading_dir=out)
    release_nb = notebook.read(released)
    record = {s: {"problem": None, "notes": [], "flags": []} for s in students}
    for student in students:
        try:
            problem = _stage(student, chapter, g, out, collected, release_nb, record[student])
        except Exception as e:  # noqa: BLE001 (one student's file never stops the others)
            problem = f"could not be staged for grading ({type(e).__name__}: {safe_text.plain(e)[:200]})"
        if problem:
            record[student]["problem"] = problem
            print(f"Cannot grade {safe_text.plain(student)}: {safe_text.plain(problem)}", flush=True)
    gradable = [s for s in students if not record[s]["problem"]]

    keys, reports = out / "keys", out / "reports" / chapter
    verdicts.answer_key(chapter, keys)  # made once, before the students (fails if the solution fails)
    try:  # the known mistakes, once too; without them the verdicts stand and name no mistake
        mistakes.key(chapter, keys)
    except Exception as e:  # noqa: BLE001 (naming mistakes is a help, never a reason not to grade)
        print(f"No mistakes will be named: the mistake key of {chapter} could not be made "
              f"({type(e).__name__}: {safe_text.plain(e)[:300]})", flush=True)
    extra = [f"--SandboxedExecute.answer_keys={keys}", f"--SandboxedExecute.report_dir={reports}"]
    if unsandboxed:
        extra.append("--SandboxedExecute.allow_unsandboxed=True")
    if all_cells:
        extra.append("--SandboxedExecute.all_cells=True")

    for student in gradable:
        (reports / f"{student}.json").unlink(missing_ok=True)
    jobs = jobs or max(1, min(len(gradable), usable_cpus()))
    failed = nbgrader_cli.each_student("autograde", chapter, gradable, "--force", *extra, jobs=jobs,
                                       grading_dir=out, submitted_dir=out / "staged", env=thread_env(jobs))
    for student in gradable:
        if failed[student]:
            why = f"autograding failed: {safe_text.plain(failure_cause(failed[student], out))}"
            record[student]["problem"] = why
            print(f"Cannot grade {safe_text.plain(student)}: {why}", flush=True)
        else:
            _read_report(reports / f"{student}.json", record[student])
    path = _record_path(chapter, out)
    safe_text.write_json(path, record)  # written whole: a later grading never finds half a record
    if shard is not None:  # written last: a share that stopped half-way has no record to merge
        return path
    return _write_outputs(chapter, g, students, record)


def _stage(student: str, chapter: str, g: Path, out: Path, collected: dict, release_nb,
           rec: dict) -> str | None:
    """Write the clean copy of ``student``'s notebook that nbgrader grades, with its repairs and
    flags in ``rec``; returns why it cannot be graded, or None."""
    path = g / "submitted" / student / chapter / f"{chapter}.ipynb"
    problem = (collected.get(student) or {}).get("problem")
    if not problem:
        problem = (notebook.submission_problem(path, chapter) if os.path.lexists(path)
                   else f"no {path.name} in the submission")
    if problem:
        return problem
    # A lone surrogate ("\ud800": valid JSON, no UTF-8) would stop nbgrader and every record.
    submission = nbformat.from_dict(safe_text.scrub(nbformat.read(str(path), as_version=4)))
    nb, notes = repair.repair(submission, release_nb)
    clean = out / "staged" / student / chapter
    shutil.rmtree(clean.parent, ignore_errors=True)
    clean.mkdir(parents=True)
    nbformat.write(nb, str(clean / path.name))
    stamp = path.parent / "timestamp.txt"  # nbgrader's, for late penalties
    if stamp.is_file() and not stamp.is_symlink():
        (clean / stamp.name).write_text(safe_text.plain(stamp.read_text(errors="replace")[:100]))
    rec.update(notes=notes, flags=flags.flags(nb, release_nb))
    return None


def _read_report(report: Path, rec: dict) -> None:
    """Add what the graded runs observed (``report``, written by SandboxedExecute) to ``rec``; a
    report missing, cut short or not of the expected shape is said in the notes, never raised."""
    try:
        found = json.loads(report.read_bytes().decode("utf-8", "replace"))
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        flags_, notes = found.get("flags", []), found.get("notes", [])
        if not isinstance(flags_, list) or not isinstance(notes, list):
            raise ValueError("flags and notes are not lists")
    except (OSError, ValueError) as e:
        why = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({type(e).__name__})"
        rec["notes"].append(f"the report of the graded runs is {why}: their flags and notes are not shown")
        return
    rec["flags"] += [safe_text.plain(f)[:300] for f in flags_]
    rec["notes"] += [safe_text.plain(n)[:300] for n in notes]
    found = found.get("mistakes")  # per failed exercise: a known mistake's why, "" or None
    rec["mistakes"] = {safe_text.plain(k)[:100]: None if v is None else safe_text.plain(v)[:300]
                       for k, v in found.items()} if isinstance(found, dict) else {}


def usable_cpus() -> int:
    """The CPUs this process may run on (a Slurm job's or a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def thread_env(jobs: int) -> dict[str, str]:
    """The thread settings of the submissions' processes when ``jobs`` are graded at once: the
    CPUs shared among them, with OpenMP's threads asleep while they wait. Threads beyond the
    CPUs fight for them: chapter 03 graded in 9.9 s a student with two students at once on 2
    cores and torch's 2 threads each, 6.3 s with one. The verdicts do not depend on it (every
    chapter's catalogues are graded with 1 and 2 threads); what the environment sets wins."""
    wanted = {"OMP_NUM_THREADS": str(max(1, usable_cpus() // jobs)), "OMP_WAIT_POLICY": "PASSIVE"}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def merge(chapter: str, grading_dir: Path | None = None, n: int | None = None) -> Path:
    """Join the N shares graded by ``grade(..., shard=(K, N))`` into ``grading_dir``: their
    autograded notebooks and gradebook rows, their problems, notes and flags; then the feedback,
    grades CSV and summary, as one run writes them. Returns the path of the grades CSV."""
    from nbgrader.api import Gradebook, MissingEntry

    g = Path(grading_dir or config.root() / "grading").resolve()
    found = sorted({int(p.name.split("-of-")[1]) for p in (g / "shards" / chapter).glob("*-of-*")})
    if n is None and len(found) != 1:
        raise SystemExit(f"Say how many shares to merge (--shards N): under {g / 'shards' / chapter} "
                         f"there are shares of {found or 'none'}.")
    n = n or found[0]
    records = {k: _load_record(_record_path(chapter, shard_dir(chapter, g, k, n))) for k in range(1, n + 1)}
    missing = [k for k, part_record in records.items() if part_record is None]
    if missing:
        raise SystemExit(f"Shares {', '.join(f'{k}/{n}' for k in missing)} of {chapter} are not graded "
                         f"(or stopped): run grade {chapter} --shard K/{n} for each, then merge again.")
    students = _students(chapter, g)
    release.generate(chapter, g / "release", grading_dir=g)  # the assignment in the main gradebook
    record = {}
    for k in range(1, n + 1):
        part = shard_dir(chapter, g, k, n)
        shard_record = records[k]
        record |= shard_record
        with Gradebook(f"sqlite:///{part / 'gradebook.db'}") as src, \
                Gradebook(f"sqlite:///{g / 'gradebook.db'}") as dst:
            for student in shard_record:
                try:
                    submission = src.find_submission(chapter, student)
                except MissingEntry:  # not graded: its problem is in the record
                    continue
                _copy_submission(submission, dst, chapter, student)
                done = part / "autograded" / student / chapter
                target = g / "autograded" / student / chapter
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(done, target)
    for student in students:  # collected after the shares were graded
        record.setdefault(student, {"problem": "not graded yet (run grade)", "notes": [], "flags": []})
    record = {s: record[s] for s in students}  # in the order one run writes them
    safe_text.write_json(_record_path(chapter, g), record)
    return _write_outputs(chapter, g, students, record)


def _copy_submission(submission, dst, chapter: str, student: str) -> None:
    """One student's graded submission, from a share's gradebook into ``dst``: the scores and
    comments autograding wrote, and what a person has added since."""
    dst.update_or_create_student(student)
    dst.update_or_create_submission(chapter, student, timestamp=submission.timestamp)
    for nb in submission.notebooks:
        into = dst.find_submission_notebook(nb.name, chapter, student)
        into.flagged, into.late_submission_penalty = nb.flagged, nb.late_submission_penalty
        for grade_ in nb.grades:
            row = dst.find_grade(grade_.name, nb.name, chapter, student)
            for field in ("auto_score", "manual_score", "extra_credit", "needs_manual_grade"):
                setattr(row, field, getattr(grade_, field))
        for comment in nb.comments:
            row = dst.find_comment(comment.name, nb.name, chapter, student)
            row.auto_comment, row.manual_comment = comment.auto_comment, comment.manual_comment
    dst.db.commit()


def export(chapter: str, grading_dir: Path | None = None) -> Path:
    """Rewrite grades, summary and feedback from the gradebook, e.g. after manual grading."""
    g = Path(grading_dir or config.root() / "grading").resolve()
    record = _load_record(_record_path(chapter, g))
    if record is None:
        raise SystemExit(f"Nothing of {chapter} has been graded under {g}: run grade first.")
    students = _students(chapter, g)
    for student in students:  # collected after the last grading
        record.setdefault(student, {"problem": "not graded yet (run grade)", "notes": [], "flags": []})
    return _write_outputs(chapter, g, students, record)


def _write_outputs(chapter: str, g: Path, students: list[str], record: dict) -> Path:
    """Feedback pages, the chapter's grades CSV and summary, and the combined gradebook. A page
    that cannot be written is said in its student's ``problem`` (the points stand); the class is
    always graded."""
    feedback_problems = {}
    if any(not record[s]["problem"] for s in students):  # every autograded notebook's page
        done = sorted(p.parent.name for p in (g / "autograded").glob(f"*/{chapter}") if p.is_dir())
        failed = nbgrader_cli.each_student("generate_feedback", chapter, done, "--force", grading_dir=g,
                                           jobs=usable_cpus())
        for student, log in failed.items():
            if log:
                why = f"no feedback page: {safe_text.plain(failure_cause(log, g))}"
                feedback_problems[student] = why
                print(f"Feedback for {safe_text.plain(student)}: {why}", flush=True)
    path = gradebook.write_grades_csv(chapter, students, g, record, feedback_problems)
    gradebook.write_summary(path, record)
    gradebook.write_combined(g)
    return path


def _load_record(path: Path) -> dict | None:
    """The record at ``path`` (problems, notes and flags per student), or None if it is missing or
    not a record (a grading stopped before it existed: grade again)."""
    try:
        record = json.loads(path.read_bytes().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and all(isinstance(r, dict) for r in record.values()) else None
