"""How well the mistake keys name mistakes, measured on the catalogues.

Every reference, catalogued mistake, correct answer of the acceptance catalogue and mistake of the
held-out set (``unseen_mistakes/NN_name.yaml``, written apart from the catalogue and read by no
key) is graded and named as the grader does (or, with ``--visible``, as the self-check does, by the
shipped key); ``tests/grading/test_catalogues.py`` holds the thresholds.

    python -m course_tools.catalogues.naming 02_attention [--visible] [--write] [--list]
"""

from __future__ import annotations

from pathlib import Path

from course_tools import config, notebook
from course_tools.catalogues import mutants
from course_tools.grading.grader import verdicts
from course_tools.grading.grader.mistakes import (
    _agreement,
    _catalogue,
    _known,
    _records,
    _view,
    key,
    load_visible,
    name,
    write_visible,
)

UNSEEN_DIR = "unseen_mistakes"  # catalogues/unseen_mistakes/NN_name.yaml: mistakes no key reads


def unseen_path(chapter: str) -> Path:
    return mutants.FOLDER / UNSEEN_DIR / f"{chapter}.yaml"


def _unseen(chapter: str) -> list[dict]:
    import yaml

    path = unseen_path(chapter)
    return (yaml.safe_load(path.read_text(encoding="utf-8")) or []) if path.is_file() else []


def measure(chapter: str, visible: bool = False, same_run: bool = False) -> list[dict]:
    """The references, every catalogued mistake, correct answer of the acceptance catalogue and
    unseen mistake of ``chapter`` graded and named as the grader does, in one recorded run (with
    ``visible``: as the self-check does, by the visible tests and the shipped key). The grader's
    key is made in a run of its own, or from this run's records with ``same_run`` (half the time;
    then each mutant names itself by construction, and only the others test the naming).

    One row per answer: ``kind`` (reference, mutant, acceptance, unseen), ``grade_id``, ``why``,
    ``failed``, ``problem`` (the verdict's words), ``events`` (what the graded run flagged),
    ``checked`` (how many checks the run made),
    ``named`` (the why of the mistake named, or None) and ``right`` (the names that would be right:
    a mutant's own and those of the mutants its record cannot be told from, or an unseen entry's
    ``same_as``)."""
    solution = notebook.read(config.solution_path(chapter))
    catalogue = _catalogue(chapter)
    answers = ([("reference", {"grade_id": ex.name, "why": "the reference solution", "reference": True})
                for ex in notebook.exercises(solution)]
               + [("mutant", e) for e in catalogue]
               + [("acceptance", e) for e in mutants.load_catalogue(chapter, "acceptance")]
               + [("unseen", e) for e in _unseen(chapter)])
    nb = notebook.read(config.student_path(chapter)) if visible else solution
    records = _records(chapter, nb, [e for _, e in answers])
    if visible:
        shipped = load_visible(chapter)["exercises"]
        answer_key = {n: e["key"] for n, e in shipped.items()}
        known = {n: e["mistakes"] for n, e in shipped.items()}
    else:
        answer_key = verdicts.answer_key(chapter)
        known = (_known(answer_key, catalogue, [r for (k, _), r in zip(answers, records, strict=True)
                                                if k == "mutant"])
                 if same_run else key(chapter))
    rows = []
    for (kind, entry), record in zip(answers, records, strict=True):
        gid = entry["grade_id"]
        problem = verdicts.judge(answer_key[gid], record)
        named = name(answer_key[gid], known[gid], record) if problem is not None else None
        if kind == "mutant":
            views = {m["why"]: _view(answer_key[gid], m["record"], known=True) for m in known[gid]}
            mine = views.get(entry["why"])
            right = [] if mine is None else [why for why, view in views.items()
                                             if _agreement(answer_key[gid], view, mine) is not None]
        else:
            right = list(entry.get("same_as") or [])
        rows.append({"kind": kind, "grade_id": gid, "why": entry["why"], "failed": problem is not None,
                     "problem": problem or "", "events": record.get("events") or [],
                     "checked": len(record.get("checks") or []),
                     "named": named["why"] if named else None, "right": right,
                     "in_key": kind == "mutant" and bool(right)})
    return rows


def tally(rows: list[dict]) -> dict[str, int]:
    """Counts of :func:`measure`'s rows: mutants in the key named right / wrong / not at all,
    correct answers named, unseen mistakes (failing ones) named right / wrong / not at all."""
    out = {k: 0 for k in ("mutants", "mutants_right", "mutants_wrong", "mutants_unnamed", "accepted",
                          "accepted_named", "unseen", "unseen_failed", "unseen_right", "unseen_wrong",
                          "unseen_unnamed")}
    for r in rows:
        if r["kind"] == "mutant" and r["in_key"]:
            out["mutants"] += 1
            out["mutants_" + ("unnamed" if r["named"] is None else "right" if r["named"] in r["right"]
                              else "wrong")] += 1
        elif r["kind"] in ("acceptance", "reference"):
            out["accepted"] += 1
            out["accepted_named"] += r["named"] is not None
        elif r["kind"] == "unseen":
            out["unseen"] += 1
            if r["failed"]:
                out["unseen_failed"] += 1
                out["unseen_" + ("unnamed" if r["named"] is None else "right" if r["named"] in r["right"]
                                 else "wrong")] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="How well the mistake keys name mistakes.")
    parser.add_argument("chapter", help="a chapter (02 or 02_attention) or 'all'")
    parser.add_argument("--visible", action="store_true", help="as the self-check does, by the shipped key")
    parser.add_argument("--write", action="store_true", help="(re)make the shipped self-check key first")
    parser.add_argument("--list", action="store_true", help="list every wrong or missing name")
    args = parser.parse_args(argv)
    for chapter in config.resolve_chapters(args.chapter):
        if args.write:
            write_visible(chapter)
        rows = measure(chapter, visible=args.visible)
        t = tally(rows)
        print(f"{chapter:<18} mutants {t['mutants_right']}/{t['mutants']} named right "
              f"({t['mutants_wrong']} wrong, {t['mutants_unnamed']} unnamed); correct answers named "
              f"{t['accepted_named']}/{t['accepted']}; unseen (failing {t['unseen_failed']}/{t['unseen']}): "
              f"{t['unseen_right']} right, {t['unseen_wrong']} wrong, {t['unseen_unnamed']} unnamed",
              flush=True)
        for r in rows if args.list else ():
            bad = r["named"] not in r["right"] + [None] or (r["right"] and r["named"] is None and r["failed"])
            if bad:
                print(f"  {r['kind']:<10} {r['grade_id']}: {r['why']}\n             named {r['named']!r}; "
                      f"right: {r['right'][:3]}")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
