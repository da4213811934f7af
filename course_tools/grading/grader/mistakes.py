"""Known mistakes: an answer that fails, named by the chapter's catalogue of wrong answers.

Runs where verdicts are decided: the grader's process and the self-check's, never a sandbox.

Every chapter has a catalogue of plausible wrong answers (``catalogues/mutants/NN_name.yaml``,
see :mod:`course_tools.catalogues.mutants`), each with a ``why`` (the mistake, in the instructor's
words) and a ``hint`` (what to look at, in a teaching assistant's). The chapter's **mistake key**
holds, per exercise, the record that each catalogued mistake leaves in a graded run
(:mod:`.verdicts`): the same runner and the same inputs as a student's answer gets, so the same
values. Only mistakes that fail their tests are in it. It is made outside any sandbox (the
catalogue is the instructor's code), in two versions:

- the grader's, from the full tests (hidden ones included), made with the answer key and kept
  beside it (:func:`key`);
- the self-check's, from the visible tests of the released notebook, made by ``release`` and
  shipped inside the package as ``known_mistakes/NN_name.json`` (:func:`write_visible`), so that
  the self-check needs neither the catalogues nor the solutions. It holds no hidden input or
  value: only what the visible tests compute, which a student can compute too.

:func:`name` runs where verdicts are decided (the grader's process, or the self-check's), never in
a graded run, and only for an exercise that has already failed. The answer's record is compared
with each known mistake's, check by check: both must pass or fail the same checks of the key,
agree where both fail (numbers within the check's tolerance, at single precision at least; the
type too where the exercise states it) and stop with the same error; a mistake that agrees on
every check names the answer. A correct answer is never named (it passes first), and an answer
that behaves like no known mistake gets no name: a wrong name is worse than none, so a mistake
is kept in a key only where it can be told apart reliably (it makes at least one check, and a
second run of it gives the same values).

How well the keys name mistakes is measured by :mod:`course_tools.catalogues.naming`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from pathlib import Path

from course_tools import config, notebook
from course_tools.grading.grader import verdicts

KNOWN_DIR = Path(__file__).resolve().parents[2] / "student" / "known_mistakes"  # shipped with the self-check
LEAD = "This looks like a known mistake: "
_AT_LINE = re.compile(r" \(raised at line \d+ of the answer\)$")


# --- making the keys ------------------------------------------------------------------------

def _catalogue(chapter: str) -> list[dict]:
    from course_tools.catalogues import mutants

    return mutants.load_catalogue(chapter, "mutant")


def _records(chapter: str, nb, entries: list[dict], timeout: float = 900) -> list[dict]:
    """Each entry of ``entries`` (catalogue format) applied to the solution and recorded by the
    tests of ``nb`` (the solution notebook: full tests; the student notebook: visible ones)."""
    from course_tools.catalogues import mutants

    solution = notebook.read(config.solution_path(chapter))
    cells = {ex.name: solution.cells[ex.solution_cell].source for ex in notebook.exercises(solution)}
    answers = [(e["grade_id"], cells[e["grade_id"]] if e.get("reference") else
                mutants.apply(e, cells[e["grade_id"]])) for e in entries]
    return mutants.run_recorded(chapter, nb, answers, timeout=timeout)


def _build(chapter: str, nb, answer_key: dict) -> dict:
    """``{grade_id: [{why, hint, record}]}``: the catalogue's mistakes that fail ``answer_key``,
    recorded by the tests of ``nb``, each twice: in the catalogue's order and in the reverse one.
    A mistake whose second record its first does not name is left out: its wrong values change
    with what ran before it in the same process (a float32 fit of an ill-conditioned system moved
    by 2e-5 between two runs), so on a student's machine they would change too."""
    entries = _catalogue(chapter)
    known = _known(answer_key, entries, _records(chapter, nb, entries))
    again = _records(chapter, nb, entries[::-1])[::-1]
    for entry, record in zip(entries, again, strict=True):
        found = known.get(entry["grade_id"], [])
        mine = [m for m in found if m["why"] == entry["why"]]
        if mine and name(answer_key[entry["grade_id"]], mine, record) is None:
            found.remove(mine[0])
    return known


def _known(answer_key: dict, entries: list[dict], records: list[dict]) -> dict:
    """The mistakes of ``entries`` that fail ``answer_key``, as the key keeps them. A mistake whose
    tests stop at the first call, with no check made, is left out: its error's message is all
    that would tell it apart, and the answer's own ``raise`` says the same for several mistakes
    ("the profile has no minimum" for the coefficients read in the wrong order as for the test of
    the opening inverted). Naming it would be a guess."""
    out: dict[str, list[dict]] = {name: [] for name in answer_key}
    for entry, record in zip(entries, records, strict=True):
        name = entry["grade_id"]
        if not record.get("checks") or record.get("events"):  # nothing to tell it by, or not named
            continue
        if name in answer_key and verdicts.judge(answer_key[name], record) is not None:
            out[name].append({"why": entry["why"], "hint": entry.get("hint") or "",
                              "record": _failures_only(answer_key[name], record)})
    return out


def _failures_only(key_checks: list[dict], record: dict) -> dict:
    """``record`` as a known mistake keeps it: each check that passes its key reduced to ``{kind,
    "passes": True}``, and each wrong value with its large tensors sampled (:func:`_sampled`):
    only the wrong values tell mistakes apart, and a tenth of the size is enough for that."""
    from course_tools.grading.grader import unwire
    from course_tools.grading.sandboxed import wire

    kept = []
    for i, got in enumerate(record.get("checks") or []):
        if i < len(key_checks) and got.get("kind") == key_checks[i]["kind"] and _passes(key_checks[i], got):
            kept.append({"kind": got["kind"], "passes": True})
        else:  # a failed observation's words are what it saw; a value's words are the key's
            words = {"what": got.get("what")} if got.get("kind") == "true" else {}
            sampled = _sampled(unwire.decode(got["actual"]))
            kept.append({"kind": got.get("kind"), "actual": wire.encode(sampled)} | words)
    return {"checks": kept, "error": record.get("error")}


def _catalogue_fingerprint(chapter: str) -> str:
    from course_tools.catalogues import mutants

    return hashlib.sha256(mutants.catalogue_path(chapter).read_bytes()).hexdigest()[:16]


def key(chapter: str, cache_dir: Path | None = None) -> dict:
    """The grader's mistake key of ``chapter`` (``{grade_id: [{why, hint, record}]}``), from the
    full tests; kept in ``cache_dir`` beside the answer key and in the user's cache
    (``~/.cache/course_lib/mistake_keys``), made again when the notebook, the course's code or the
    catalogue changes. ``{}`` where the chapter has no catalogue (a course
    that adds a chapter names no mistakes until it writes one)."""
    from course_tools.catalogues import mutants

    if not mutants.catalogue_path(chapter).is_file():
        return {}
    nb = notebook.read(config.solution_path(chapter))
    req = verdicts.request(nb, recording=False)
    if cache_dir is None:
        return _build(chapter, nb, verdicts.answer_key(chapter))
    made_from = f"{verdicts._fingerprint(req)} {_catalogue_fingerprint(chapter)}"
    name_ = f"{chapter}-mistakes-{hashlib.sha256(made_from.encode()).hexdigest()[:16]}.json"
    # the grading folder's copy, else the user's (the same notebook, code and catalogue give the
    # same key: a second grading folder, or a share on the same machine, does not make it again)
    paths = [Path(cache_dir) / name_, Path.home() / ".cache" / "course_lib" / "mistake_keys" / name_]
    found = next((json.loads(p.read_text(encoding="utf-8")) for p in paths if p.is_file()), None)
    if found is None:
        found = _build(chapter, nb, verdicts.answer_key(chapter, cache_dir))
    for path in paths:
        if not path.is_file():
            with contextlib.suppress(OSError):  # a read-only home only costs the next grading time
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(found), encoding="utf-8")
                tmp.replace(path)
    return found


def visible_path(chapter: str) -> Path:
    return KNOWN_DIR / f"{chapter}.json"


def sources(chapter: str) -> str:
    """What the self-check's key is made from: the catalogue and the released notebook's set-up,
    answer and test cells (as the student has them), and the solution's answer cells."""
    from course_tools.catalogues import mutants

    h = hashlib.sha256(mutants.catalogue_path(chapter).read_bytes())
    for path in (config.student_path(chapter), config.solution_path(chapter)):
        nb = notebook.read(path)
        for i in notebook.setup_cells(nb)[1:]:
            h.update(nb.cells[i].source.encode())
        for ex in notebook.exercises(nb):
            h.update(nb.cells[ex.solution_cell].source.encode() + nb.cells[ex.test_cell].source.encode())
    return h.hexdigest()


def write_visible(chapter: str) -> Path:
    """Make the self-check's mistake key of ``chapter`` from its released notebook (``release``
    calls it after writing the notebook): the visible tests' key (each check's kind, tolerance and
    expected value, which the visible tests compute from course_lib) and the records of the
    mistakes those tests catch."""
    from course_tools.catalogues import mutants

    student = notebook.read(config.student_path(chapter))
    solution = notebook.read(config.solution_path(chapter))
    answers = {ex.name: solution.cells[ex.solution_cell].source for ex in notebook.exercises(solution)}
    req = verdicts.request(student, answers=answers, recording=False)
    results = verdicts.run_elsewhere(req, timeout=60 + 2 * req["timeout"] * len(req["exercises"]),
                                     cwd=str(config.student_path(chapter).parent))
    broken = {name: r["error"] for name, r in results.items() if r.get("error")}
    if broken:
        raise verdicts.NoAnswerKey(f"the solution of {chapter} fails its visible tests: {broken}")
    visible_key = {name: r["checks"] for name, r in results.items()}
    found = _build(chapter, student, visible_key) if mutants.catalogue_path(chapter).is_file() else {}
    data = {"chapter": chapter, "sources": sources(chapter),
            "exercises": {name: {"key": visible_key[name], "mistakes": found.get(name, [])}
                          for name in visible_key}}
    path = visible_path(chapter)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def load_visible(chapter: str) -> dict:
    """The shipped self-check key of ``chapter`` (``{}`` if there is none)."""
    path = visible_path(chapter)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


# --- naming -------------------------------------------------------------------------------------

SAMPLE = 64  # values kept of a larger tensor: where two wrong answers differ, they differ there too


def name(key_checks: list[dict], known: list[dict], result) -> dict | None:
    """The known mistake (``{why, hint, record}``) whose record the failing ``result`` matches on
    every check of ``key_checks`` (the exercise's answer key), the closest where several do (the
    most wrong values equal to the last bit, then the catalogue's order); None if none does.

    A run the guard reported (``events``: introspection refused, a signal handler, threads...) is
    never named: what it recorded may be the trick's doing, different from one run to the next,
    and a person reads its flags anyway."""
    if isinstance(result, dict) and result.get("events"):
        return None
    try:  # the record came from a graded run: whatever it holds, naming fails quietly
        answer = _view(key_checks, result, known=False)
        best, best_score = None, -1
        for mistake in known if answer is not None else ():
            score = _agreement(key_checks, _view(key_checks, mistake["record"], known=True), answer)
            if score is not None and score > best_score:
                best, best_score = mistake, score
        return best
    except Exception:  # noqa: BLE001 (a value no comparison expected: no name, never an error)
        return None


_UNREADABLE = object()


def _view(key_checks: list[dict], record, known: bool) -> dict | None:
    """What a record says check by check: ``(passes, value, what)``, the value (sampled) only where
    the check fails; its error without where in the answer, and where that error sent the tests
    on another path than the key's (``diverged``). None for a record that took another path with
    no error. ``known``: a key's own record, which may say a check passed."""
    from course_tools.grading.grader import unwire

    found = record.get("checks") if isinstance(record, dict) else None
    if not isinstance(found, list) or len(found) > len(key_checks):
        return None
    checks_, error, diverged = [], record.get("error"), None
    for i, (want, got) in enumerate(zip(key_checks, found, strict=False)):
        if not isinstance(got, dict) or got.get("kind") != want["kind"]:
            if error is None:
                return None
            diverged = (i, str(got.get("kind")) if isinstance(got, dict) else "")  # the error sent the
            break  # tests elsewhere, as it does the same way for the same mistake
        if not known:  # only a key's own records may say that a check passed
            got = {k: v for k, v in got.items() if k != "passes"}
        passes, value = _passes(want, got), None
        if not passes:
            try:
                value = _sampled(unwire.decode(got.get("actual")))
            except unwire.WireError:
                value = _UNREADABLE
        checks_.append((passes, value, got.get("what")))
    return {"checks": checks_, "diverged": diverged, "error": None if error is None else
            _AT_LINE.sub("", str(error)), "unfinished": str(error).startswith("no result came back")}


def _agreement(key_checks: list[dict], a: dict | None, b: dict | None) -> int | None:
    """None if two records' views (:func:`_view`) differ anywhere the key can tell: a check one
    passes and the other fails, two wrong values that differ, another error; else how many of
    their wrong values are identical. A run stopped by a limit says nothing about the mistake."""
    if a is None or b is None or len(a["checks"]) != len(b["checks"]) or a["error"] != b["error"] \
            or a["diverged"] != b["diverged"] or a["unfinished"] or b["unfinished"]:
        return None
    identical = 0
    for want, (passes, x, what_x), (passes_y, y, what_y) in zip(key_checks, a["checks"], b["checks"],
                                                                strict=False):
        if passes != passes_y:
            return None
        if not passes:
            same = _same_failure(want["kind"], want["params"], (x, what_x), (y, what_y))
            if same is None:
                return None
            identical += same
    return identical


def _passes(want: dict, got: dict) -> bool:
    """Whether the recorded check ``got`` passes the key's check ``want``."""
    from course_tools.grading.grader import unwire
    from course_tools.student import judges

    if got.get("passes") is True:  # a known mistake's check, passed when its key was made
        return True
    what = str(got.get("what") or want["what"]) if want["kind"] == "true" else want["what"]
    try:
        judges.JUDGES[want["kind"]](unwire.decode(got["actual"]), unwire.decode(want["expected"]), what,
                                    **verdicts.params_from_data(want["params"]))
        return True
    except Exception:  # noqa: BLE001 (any failure of the check is a failure)
        return False


def _same_failure(kind: str, params: dict, x: tuple, y: tuple) -> bool | None:
    """For two ``(value, what)`` that both fail a check of ``kind``: None if they are different
    wrong values, True if identical, False if the same within the check's tolerance. Numbers are
    compared with the check's precision (NaN equal to NaN), everything else exactly; a failed
    observation by its message, which holds what it saw."""
    import torch

    from course_tools.grading.sandboxed import wire

    (a, what_a), (b, what_b) = x, y
    if a is _UNREADABLE or b is _UNREADABLE:
        return None
    if kind == "true":
        return True if (a is b is False and what_a == what_b) else None
    if kind == "raises":
        return True if _first_class(a) == _first_class(b) else None
    if kind in ("forbidden", "unchanged"):
        return True if bool(a) == bool(b) else None
    if kind == "device":
        same = isinstance(a, dict) and isinstance(b, dict) and all(
            bool(a.get(k)) == bool(b.get(k)) for k in ("mixed", "error")) and all(
            a.get(k) == b.get(k) for k in ("meta", "cpu"))
        return True if same else None
    if kind not in ("close", "grads", "equal"):
        return None
    if json.dumps(wire.encode(a), sort_keys=True) == json.dumps(wire.encode(b), sort_keys=True):
        return True
    params = verdicts.params_from_data(params)
    if (params.get("types") or params.get("dtype")) and _signature(a) != _signature(b):
        return None  # the exercise states the type: a NumPy array and a float tensor are two mistakes
    # At single precision at least: a wrong value is often ill-conditioned (N^2 for N), and the same
    # mistake run on another machine, or beside other answers, differs in more than the last bits.
    precision = None if kind == "equal" else params.get("precision") or torch.float32
    precision = torch.float32 if precision == torch.float64 else precision
    return False if _alike(a, b, precision, params.get("terms") or 1) else None


def _signature(value) -> tuple[str, str]:
    """A value's Python type and dtype, as sent (a sampled tensor's as it was)."""
    if isinstance(value, dict) and "sampled" in value:
        return value["type"], str(value["values"].dtype)
    return type(value).__name__, str(getattr(value, "dtype", ""))


def _sampled(value):
    """``value`` with each tensor or array of more than ``SAMPLE`` elements replaced by
    ``{"sampled": shape, "type": "Tensor" or "ndarray", "values": SAMPLE of its elements, evenly
    spaced, the first and last included}``."""
    import numpy as np
    import torch

    if isinstance(value, (torch.Tensor, np.ndarray)) and _numel(value) > SAMPLE:
        where = np.linspace(0, _numel(value) - 1, SAMPLE).round().astype(np.int64)
        if isinstance(value, torch.Tensor):
            values = value.detach().reshape(-1)[torch.from_numpy(where)].clone()
        else:
            values = np.ascontiguousarray(value).reshape(-1)[where].copy()
        return {"sampled": list(value.shape), "type": type(value).__name__, "values": values}
    if isinstance(value, dict):
        return {k: _sampled(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_sampled(v) for v in value)
    return value


def _numel(value) -> int:
    return value.numel() if hasattr(value, "numel") else int(value.size)


def _alike(a, b, precision, terms: int) -> bool:
    """The same structure, with the same numbers: within the course's tolerance for ``precision``
    (a float dtype), exactly for ``None``."""
    import numpy as np
    import torch

    from course_tools.student import judges

    numeric = (torch.Tensor, np.ndarray, np.generic, int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and bool not in (type(a), type(b)):
        try:
            x, y = torch.as_tensor(a), torch.as_tensor(b)
        except (TypeError, RuntimeError):  # a NumPy dtype torch does not have
            return bool(np.array_equal(np.asarray(a), np.asarray(b)))
        if tuple(x.shape) != tuple(y.shape) or x.is_complex() or y.is_complex():
            return False
        if precision is None or not (x.is_floating_point() or y.is_floating_point()):
            return bool(torch.equal(x.to(torch.float64), y.to(torch.float64)))
        try:
            judges.JUDGES["close"](x, y, "", precision=precision, terms=terms, equal_nan=True)
            return True
        except AssertionError:
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_alike(a[k], b[k], precision, terms) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_alike(u, v, precision, terms) for u, v in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _first_class(raised) -> str | None:
    return (raised.get("classes") or [None])[0] if isinstance(raised, dict) else None


def hint_line(mistake: dict | None) -> str:
    """The line under a FAIL that names ``mistake`` ('' for none)."""
    return f"{LEAD}{mistake['hint']}" if mistake and mistake.get("hint") else ""
