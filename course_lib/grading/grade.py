"""Autograde one chapter for every collected student and write the grades.

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
   ``<grading>/grades.csv`` (one row per student of the export: name, LMS id, points per exercise
   and written question, sums, problem, notes, flags) and a summary per exercise as
   ``summary.txt`` and ``summary.png``. Problems, notes and flags are kept in
   ``<grading>/graded/<chapter>.json`` so that ``export`` writes the same rows after manual
   grading.

A class can be graded in N shares on N machines (a Slurm job array, a Kubernetes Indexed Job;
see the instructors' page): ``grade(..., shard=(K, N))`` grades only the students of the K-th
share (:func:`shard_of`, a hash of the student's folder name, which collect keys by the LMS id,
so the shares are the same on every machine and every run) and writes everything it makes under
``<grading>/shards/<chapter>/K-of-N/``, reading nothing there but ``submitted/`` and the collect
manifest: a failed share is graded again alone, touching no other. :func:`merge` then copies
each share's autograded notebooks and gradebook rows into ``<grading>`` and writes the feedback,
``grades.csv`` and the summary exactly as one run would have.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import nbformat

from . import collect, config, flags, nbgrader_cli, notebook, release, repair, sandbox, verdicts
from .failures import failure_cause

ALLOWED_EXTRA = {"timestamp.txt"}  # what nbgrader's own collect puts beside a notebook


def problem_with(path: Path, chapter: str) -> str | None:
    """Why ``path`` cannot be graded as ``chapter``, or None if it can."""
    folder = path.parent
    others = sorted(p.name for p in folder.iterdir() if p.name != path.name and not (
        p.name in ALLOWED_EXTRA and stat.S_ISREG(p.lstat().st_mode)))
    if others:
        return f"the folder holds more than the notebook ({', '.join(others)[:200]}): collect it again"
    mode = path.lstat()
    if not stat.S_ISREG(mode.st_mode) or mode.st_nlink != 1:
        return "the notebook is not a regular file (a link or a device): collect it again"
    try:
        nb = nbformat.read(str(path), as_version=4)
    except Exception as e:  # noqa: BLE001 (any unreadable file gets the same treatment)
        return f"not a valid notebook ({type(e).__name__}: {str(e)[:120]})"
    if not nb.cells:
        return "the notebook is empty"
    expected = {ex.name for ex in notebook.exercises(notebook.read(config.solution_path(chapter)))}
    found = {notebook.nbgrader_meta(c).get("grade_id") for c in nb.cells}
    if not expected & found:
        return f"this is not the {chapter} notebook (none of its exercises {sorted(expected)} is in it)"
    return None


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
    """Autograde ``chapter``; returns the path of the grades CSV (with ``shard=(K, N)``: of the
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
        path = g / "submitted" / student / chapter / f"{chapter}.ipynb"
        problem = (collected.get(student) or {}).get("problem")
        if not problem:
            problem = problem_with(path, chapter) if os.path.lexists(path) else (
                f"no {path.name} in the submission")
        if problem:
            record[student]["problem"] = problem
            print(f"Cannot grade {student}: {path}: {problem}", flush=True)
            continue
        nb, notes = repair.repair(nbformat.read(str(path), as_version=4), release_nb)
        clean = out / "staged" / student / chapter
        shutil.rmtree(clean.parent, ignore_errors=True)
        clean.mkdir(parents=True)
        nbformat.write(nb, str(clean / path.name))
        stamp = path.parent / "timestamp.txt"  # nbgrader's, for late penalties
        if stamp.is_file() and not stamp.is_symlink():
            (clean / stamp.name).write_text(stamp.read_text(errors="replace")[:100])
        record[student].update(notes=notes, flags=flags.flags(nb, release_nb))
    gradable = [s for s in students if not record[s]["problem"]]

    keys, reports = out / "keys", out / "reports" / chapter
    verdicts.answer_key(chapter, keys)  # made once, before the students (fails if the solution fails)
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
            record[student]["problem"] = why = f"autograding failed: {failure_cause(failed[student], out)}"
            print(f"Cannot grade {student}: {why}", flush=True)
        report = reports / f"{student}.json"
        if report.is_file():  # what the graded runs observed (written by SandboxedExecute)
            found = json.loads(report.read_text(encoding="utf-8"))
            record[student]["flags"] += [str(f)[:300] for f in found.get("flags", [])]
            record[student]["notes"] += [str(n)[:300] for n in found.get("notes", [])]
    path = _record_path(chapter, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
    if shard is not None:  # written last: a share that stopped half-way has no record to merge
        return path
    return _write_outputs(chapter, g, students, record)


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
    grades.csv and summary, as one run writes them. Returns the path of grades.csv."""
    from nbgrader.api import Gradebook, MissingEntry

    g = Path(grading_dir or config.root() / "grading").resolve()
    found = sorted({int(p.name.split("-of-")[1]) for p in (g / "shards" / chapter).glob("*-of-*")})
    if n is None and len(found) != 1:
        raise SystemExit(f"Say how many shares to merge (--shards N): under {g / 'shards' / chapter} "
                         f"there are shares of {found or 'none'}.")
    n = n or found[0]
    missing = [k for k in range(1, n + 1) if not _record_path(chapter, shard_dir(chapter, g, k, n)).is_file()]
    if missing:
        raise SystemExit(f"Shares {', '.join(f'{k}/{n}' for k in missing)} of {chapter} are not graded "
                         f"(or stopped): run grade {chapter} --shard K/{n} for each, then merge again.")
    students = _students(chapter, g)
    release.generate(chapter, g / "release", grading_dir=g)  # the assignment in the main gradebook
    record = {}
    for k in range(1, n + 1):
        part = shard_dir(chapter, g, k, n)
        shard_record = json.loads(_record_path(chapter, part).read_text(encoding="utf-8"))
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
    path = _record_path(chapter, g)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {s: record[s] for s in students}  # in the order one run writes them
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False), encoding="utf-8")
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
    path = _record_path(chapter, g)
    if not path.is_file():
        raise SystemExit(f"Nothing of {chapter} has been graded under {g}: run grade first.")
    record = json.loads(path.read_text(encoding="utf-8"))
    students = _students(chapter, g)
    for student in students:  # collected after the last grading
        record.setdefault(student, {"problem": "not graded yet (run grade)", "notes": [], "flags": []})
    return _write_outputs(chapter, g, students, record)


def _write_outputs(chapter: str, g: Path, students: list[str], record: dict) -> Path:
    if any(not record[s]["problem"] for s in students):  # every autograded notebook's page
        done = sorted(p.parent.name for p in (g / "autograded").glob(f"*/{chapter}") if p.is_dir())
        failed = nbgrader_cli.each_student("generate_feedback", chapter, done, "--force", grading_dir=g,
                                           jobs=usable_cpus())
        logs = [log for log in failed.values() if log]
        if logs:
            raise RuntimeError("\n".join(["nbgrader generate_feedback failed:", *logs]))
    path = write_grades_csv(chapter, students, g, record)
    write_summary(path)
    return path


# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value):
    """``value`` as a CSV cell no spreadsheet runs: text starting with ``= + - @``, a tab or a
    carriage return gets a leading ``'`` (``"=2+5" -> "'=2+5"``); numbers stay numbers."""
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def write_grades_csv(chapter: str, students: list[str], grading_dir: Path, record: dict) -> Path:
    """One row per student: name and LMS id (from collect), points per autograded exercise and per
    written question (empty until graded by hand in the formgrader), the autograded sum and
    maximum, the overall ones, the problem that stopped grading (then every score is 0), the
    repairs made to the notebook's metadata and the flags for a person to read. Names, problems and
    every other text come from students' files: each text cell is :func:`spreadsheet_safe` and
    quoted, so that no cell is a formula and no separator in a text starts a new cell."""
    from nbgrader.api import Gradebook, MissingEntry

    nb = notebook.read(config.solution_path(chapter))
    exercises = {ex.name: ex.points for ex in notebook.exercises(nb)}
    written = notebook.written_questions(nb)
    full = sum(exercises.values())
    collected = collect.manifest(chapter, grading_dir)["students"]
    rows = []
    with Gradebook(f"sqlite:///{grading_dir / 'gradebook.db'}") as gb:
        for student in students:
            info, rec = collected.get(student) or {}, record[student]
            row = {"student": student, "name": info.get("name") or student,
                   "lms_id": info.get("lms_id") or "", "chapter": chapter,
                   "problem": rec["problem"] or "", "notes": "; ".join(rec["notes"]),
                   "flags": "; ".join(rec["flags"])}
            try:
                # find_submission_notebook(notebook, assignment, student)
                sub = None if row["problem"] else gb.find_submission_notebook(chapter, chapter, student)
            except MissingEntry:
                sub, row["problem"] = None, "not graded (see the output of the grade command)"
            if sub is None:
                row.update({name: 0.0 for name in exercises} | {name: "" for name in written})
                row.update(autograded=0.0, autograded_max=full, total=0.0, max="")
            else:
                grades = {gr.name.removesuffix(config.TEST_SUFFIX): gr for gr in sub.grades}
                row.update({name: grades[name].score for name in exercises})
                row.update({name: grades[name].manual_score for name in written})
                row.update(autograded=sum(row[name] for name in exercises), autograded_max=full,
                           total=sub.score, max=sub.max_score)
            rows.append(row)
    path = grading_dir / "grades.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        fields = ["student", "name", "lms_id", "chapter", *exercises, *written, "autograded",
                  "autograded_max", "total", "max", "problem", "notes", "flags"]
        writer = csv.DictWriter(f, fieldnames=fields, quoting=csv.QUOTE_NONNUMERIC)
        writer.writeheader()
        writer.writerows({k: spreadsheet_safe(v) for k, v in row.items()} for row in rows)
    return path


def summarize(grades_csv: Path) -> list[dict]:
    """Per exercise: mean score, its maximum, and the share of students with full marks."""
    with grades_csv.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    chapter = rows[0]["chapter"]
    nb = notebook.read(config.solution_path(chapter))
    out = []
    for ex in notebook.exercises(nb):
        scores = [float(r[ex.name]) for r in rows]
        out.append({"exercise": ex.name, "points": ex.points, "mean": sum(scores) / len(scores),
                    "full_marks": sum(s >= ex.points for s in scores) / len(scores)})
    return out


def write_summary(grades_csv: Path) -> tuple[Path, Path]:
    """``summary.txt`` (printed too) and ``summary.png`` beside the grades CSV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarize(grades_csv)
    width = max(len(s["exercise"]) for s in stats)
    lines = [f"{'exercise':<{width}}  mean / points  full marks"]
    lines += [f"{s['exercise']:<{width}}  {s['mean']:5.2f} / {s['points']:<5g}  {s['full_marks']:6.0%}"
              for s in stats]
    text = grades_csv.with_name("summary.txt")
    text.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(stats)), 3))
    ax.bar([s["exercise"].removeprefix("ex_") for s in stats], [100 * s["full_marks"] for s in stats])
    ax.set_ylabel("students with full marks (%)")
    ax.set_ylim(0, 100)
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    png = grades_csv.with_name("summary.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return text, png
