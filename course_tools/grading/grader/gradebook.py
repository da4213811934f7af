"""The gradebook as files: a table per chapter, a summary per chapter, and one for the LMS.

**Grader side**: runs in the grader's own process, never beside student code.

Under the grading folder:

- ``grades/<chapter>.csv``: one row per student of the chapter's export (:func:`write_grades_csv`);
  grading one chapter never touches another's table;
- ``grades/<chapter>-summary.txt`` and ``grades/<chapter>-summary.png``: per exercise, the mean
  score, the share of students with full marks and how many made each known mistake
  (:func:`write_summary`);
- ``gradebook.csv``: every chapter's table joined, one row per student (``student``, ``name``,
  ``lms_id``), a column per chapter and exercise (``01_tokenization:ex_merge``) and per chapter
  the totals (``01_tokenization:total``, ``01_tokenization:max``) (:func:`write_combined`). Moodle
  and Canvas import such a CSV, matching students by the id column chosen at import.

Every text cell is :func:`safe_text.cell`: one readable line, never a formula; numbers unquoted.
"""

from __future__ import annotations

import csv
from pathlib import Path

from course_tools import config, notebook
from course_tools.grading.grader import collect, safe_text

COMBINED = "gradebook.csv"
TOTALS = ("autograded", "autograded_max", "total", "max")


def grades_path(chapter: str, grading_dir: Path) -> Path:
    return Path(grading_dir) / "grades" / f"{chapter}.csv"


def write_grades_csv(chapter: str, students: list[str], grading_dir: Path, record: dict,
                     feedback_problems: dict[str, str] | None = None) -> Path:
    """``grades/<chapter>.csv``, one row per student: name and LMS id (from collect), points per
    autograded exercise and per written question (empty until graded by hand in the formgrader),
    the autograded sum and maximum, the overall ones, the problem that stopped grading (then every
    score is 0; a feedback page that could not be written is said there too, and costs nothing),
    the repairs made to the notebook's metadata, the flags for a person to read, the known mistakes
    the failed exercises make (``ex_name: why``, :mod:`.mistakes`) and the answers much like
    another student's or a reference's (:mod:`similarity`). Names, problems
    and every other text come from students' files: each text cell is :func:`safe_text.cell` and
    quoted, so that no cell is a formula and no separator in a text starts a new cell."""
    from nbgrader.api import Gradebook, MissingEntry

    feedback_problems = feedback_problems or {}
    nb = notebook.read(config.solution_path(chapter))
    exercises = {ex.name: ex.points for ex in notebook.exercises(nb)}
    written = notebook.written_questions(nb)
    full = sum(exercises.values())
    collected = collect.manifest(chapter, grading_dir)["students"]
    rows = []
    with Gradebook(f"sqlite:///{Path(grading_dir) / 'gradebook.db'}") as gb:
        for student in students:
            info, rec = collected.get(student) or {}, record[student]
            problem = rec["problem"] or ""
            row = {"student": student, "name": info.get("name") or student,
                   "lms_id": info.get("lms_id") or "", "chapter": chapter, "problem": problem,
                   "notes": "; ".join(map(str, rec["notes"])), "flags": "; ".join(map(str, rec["flags"]))}
            try:
                # find_submission_notebook(notebook, assignment, student)
                sub = None if problem else gb.find_submission_notebook(chapter, chapter, student)
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
            if student in feedback_problems:
                row["problem"] = "; ".join(filter(None, [row["problem"], feedback_problems[student]]))
            row["mistakes"] = "; ".join(f"{name}: {why}" for name, why in (rec.get("mistakes") or {}).items()
                                        if why and not row["problem"])
            rows.append(row)
    similar = _similar(chapter, grading_dir)
    for row in rows:
        row["similar"] = similar.get(row["student"], "")
    fields = ["student", "name", "lms_id", "chapter", *exercises, *written, *TOTALS,
              "problem", "notes", "flags", "mistakes", "similar"]
    path = grades_path(chapter, grading_dir)
    _write_csv(path, fields, rows)
    return path


def _similar(chapter: str, grading_dir: Path) -> dict[str, str]:
    """The ``similar`` column (:mod:`similarity`), and its HTML report written beside the table; a
    report that cannot be made is said in every row, never stops the table."""
    from course_tools.grading.grader import similarity

    try:
        similarity.write_report(chapter, grading_dir)
        return similarity.similar_column(chapter, grading_dir)
    except Exception as e:  # noqa: BLE001 (the grades matter more than the report)
        why = f"no similarity report: {type(e).__name__}: {safe_text.plain(str(e))[:200]}"
        return {student: why for student in collect.manifest(chapter, grading_dir)["students"]}


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Whole or not at all (a temporary file, then a rename), every text cell safe (a cell read
    back from a table this module wrote is left as it is: ``"'=1"`` starts with ``'``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, quoting=csv.QUOTE_NONNUMERIC, restval="")
        writer.writeheader()
        writer.writerows({k: safe_text.cell(v) for k, v in row.items()} for row in rows)
    tmp.replace(path)


def _number(text: str):
    """A score as read back from a CSV: ``"1.5" -> 1.5``; an empty cell (not graded yet) stays ``""``."""
    try:
        return float(text)
    except ValueError:
        return ""


def write_combined(grading_dir: Path) -> Path:
    """``gradebook.csv``: one row per student of any chapter, with each chapter's points per
    exercise and written question and its totals (empty where a student has no row)."""
    grading_dir = Path(grading_dir)
    fields, rows = ["student", "name", "lms_id"], {}
    for path in sorted((grading_dir / "grades").glob("*.csv")):
        chapter = path.stem
        if not config.CHAPTER_RE.match(chapter):
            continue
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            scores = header[header.index("chapter") + 1:header.index("problem")]
            fields += [f"{chapter}:{name}" for name in scores]
            for line in reader:
                row = rows.setdefault(line["student"], {"student": line["student"], "name": line["name"],
                                                        "lms_id": line["lms_id"]})
                row.update({f"{chapter}:{name}": _number(line[name]) for name in scores})
    path = grading_dir / COMBINED
    _write_csv(path, fields, [rows[s] for s in sorted(rows)])
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


def mistake_counts(grades_csv: Path, record: dict) -> dict[str, dict]:
    """Per exercise, of the students graded without a problem who did not get full marks: how many
    made each known mistake (``named``, by its why), how many another (``unnamed``) and how many
    left it unanswered (``unanswered``)."""
    with grades_csv.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    nb = notebook.read(config.solution_path(rows[0]["chapter"]))
    out = {}
    for ex in notebook.exercises(nb):
        named: dict[str, int] = {}
        unnamed = unanswered = 0
        for row in rows:
            if row["problem"] or float(row[ex.name]) >= ex.points:
                continue
            found = (record.get(row["student"]) or {}).get("mistakes") or {}
            why = found.get(ex.name, "")
            if why is None:
                unanswered += 1
            elif why:
                named[why] = named.get(why, 0) + 1
            else:
                unnamed += 1
        out[ex.name] = {"named": dict(sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))),
                        "unnamed": unnamed, "unanswered": unanswered}
    return out


def write_summary(grades_csv: Path, record: dict | None = None) -> tuple[Path, Path]:
    """``<chapter>-summary.txt`` (printed too) and ``<chapter>-summary.png`` beside the chapter's
    grades CSV: per exercise the mean score and the share with full marks and, from the grading
    ``record``, how many students made each known mistake (:func:`mistake_counts`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summarize(grades_csv)
    counts = mistake_counts(grades_csv, record or {})
    width = max(len(s["exercise"]) for s in stats)
    lines = [f"{'exercise':<{width}}  mean / points  full marks"]
    lines += [f"{s['exercise']:<{width}}  {s['mean']:5.2f} / {s['points']:<5g}  {s['full_marks']:6.0%}"
              for s in stats]
    lines += ["", "Students without full marks, by the known mistake their answer makes:"]
    for name, c in counts.items():
        if not (c["named"] or c["unnamed"] or c["unanswered"]):
            continue
        lines.append(f"{name}")
        lines += [f"  {n:4d}  {why}" for why, n in c["named"].items()]
        lines += [f"  {c['unnamed']:4d}  (a mistake the catalogue does not name)"] if c["unnamed"] else []
        lines += [f"  {c['unanswered']:4d}  (not answered)"] if c["unanswered"] else []
    text = grades_csv.with_name(f"{grades_csv.stem}-summary.txt")
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    labels = [s["exercise"].removeprefix("ex_") for s in stats]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(5, 1.2 * len(stats)), 6), sharex=True)
    top.bar(labels, [100 * s["full_marks"] for s in stats])
    top.set_ylabel("students with full marks (%)")
    top.set_ylim(0, 100)
    below = [0] * len(stats)
    for part, label in [("named", "a known mistake"), ("unnamed", "another mistake"),
                        ("unanswered", "not answered")]:
        heights = [sum(c["named"].values()) if part == "named" else c[part] for c in counts.values()]
        bottom.bar(labels, heights, bottom=below, label=label)
        below = [b + h for b, h in zip(below, heights, strict=True)]
    bottom.set_ylabel("students without full marks")
    bottom.legend(fontsize="small")
    bottom.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    png = grades_csv.with_name(f"{grades_csv.stem}-summary.png")
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return text, png
