"""Similarity report: answers of one chapter compared with each other and with the references.

**Grader side**: runs in the grader's own process, never beside student code.

    python -m course_tools similar 02        (or: make similar CHAPTER=02)

For every exercise, each student's answer cell (the code cell with the exercise's ``grade_id`` and
``solution: true``; never its test cell) in ``<grading>/submitted/<student>/<chapter>/<chapter>.ipynb``
is

1. normalised (:func:`tokens`): magics dropped, parsed and unparsed with ``ast`` where it parses
   (comments, docstrings, bare strings, parentheses, quotes and layout go), then tokenized; every
   name the answer binds becomes one placeholder ``V``, while keywords, builtins, imported modules
   (an alias is read as the module it stands for: ``import torch as T`` gives ``torch``),
   attribute names (``.softmax``) and keyword-argument names (``dim=``) are kept, so that
   ``torch.softmax`` and ``torch.exp`` stay apart however the variables are called;
2. fingerprinted (:func:`fingerprints`): hashes of every ``K`` consecutive tokens (blake2b, the
   same on every run), winnowed with a window of ``WINDOW`` (Schleimer, Wilkerson and Aiken,
   "Winnowing: local algorithms for document fingerprinting", SIGMOD 2003), less every fingerprint
   of the released stub cell (``notebooks/``), which every student starts from;
3. compared (:func:`score`, the Jaccard index of two fingerprint sets) with every other student's
   answer, with the public solution's cell and with course_lib's reference of the exercise (the
   top-level function named like the exercise, when there is one). A pair scoring ``THRESHOLD``
   or more is listed. An answer with fewer than ``MIN_PRINTS`` fingerprints of its own (a one-line
   exercise, an untouched stub) is not compared: all correct answers to it look alike.

:func:`write_report` writes ``<grading>/similarity/<chapter>.html`` (one file, no network, every
student text escaped): per exercise, the listed pairs by score, both answers side by side.
:func:`similar_column` gives each student a line such as ``"ex_rope: 0.93 with Jane_Doe_1001;
ex_merge: 1.00 with solution"`` for the grades table. A submission that cannot be read is skipped, and
the report and the column say why.

Calibration (tests/grading/test_similarity.py, on the acceptance catalogues: correct answers
written differently): the highest score between two correct answers of an exercise, or one and the
solution or course_lib, is 0.49 to 0.67 per chapter; copies with renamed names,
other comments and reformatting score 1.00; only a pair of entries one line apart (near-copies by
construction) reaches ``THRESHOLD``. See book/instructors.md, "Similarity report".

Why no library: ``copydetect`` 0.5.0 (MIT) winnows k-grams hashed with Python's salted ``hash()``,
so which fingerprints it keeps, hence its scores, change from run to run, and its pygments filter
turns every name, attributes included, into ``V`` (``torch.exp`` is ``torch.log``), which is too
coarse for answers of a few lines; its report loads Bootstrap from a CDN. ``compare50`` is GPLv3 and
pins ``attrs<21``, which Jupyter's packages cannot install beside; ``pycode-similar`` (last release
2020) diffs whole functions' ASTs and has no fingerprints. Winnowing is 20 lines here.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import html
import io
import itertools
import keyword
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from course_tools import config, notebook

K = 4  # tokens per k-gram
WINDOW = 2  # winnowing window: every match of K + WINDOW - 1 = 5 tokens or more shares a fingerprint
THRESHOLD = 0.75  # calibrated: see the module's docstring
MIN_PRINTS = 8
MAX_SOURCE = 100_000  # characters of an answer read (a real answer is far shorter)
SOLUTION, REFERENCE = "solution", "course_lib"
_KEPT = frozenset(dir(builtins)) | frozenset(keyword.kwlist)


@dataclass(frozen=True)
class Answer:
    who: str  # a student's folder name, SOLUTION or REFERENCE
    source: str
    prints: frozenset[int]


@dataclass(frozen=True)
class Pair:
    exercise: str
    score: float
    a: Answer
    b: Answer


@dataclass
class Comparison:
    chapter: str
    pairs: list[Pair] = field(default_factory=list)  # at or above THRESHOLD, best first per exercise
    skipped: dict[str, str] = field(default_factory=dict)  # student -> why not compared at all
    short: dict[str, list[str]] = field(default_factory=dict)  # exercise -> students too short to compare
    exercises: list[str] = field(default_factory=list)


# --- normalisation and fingerprints ---------------------------------------------------------

def _imports(tree: ast.AST) -> dict[str, str]:
    """Names bound by the imports in ``tree`` -> what they stand for (``F`` -> ``torch.nn.functional``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                out[a.asname or a.name] = a.name
    return out


class _DropStrings(ast.NodeTransformer):
    """Docstrings and other bare string statements are comments."""

    def generic_visit(self, node):
        super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                and isinstance(s.value.value, str))]
                setattr(node, name, kept or ([ast.Pass()] if name == "body" else []))
        return node


def _canonical(source: str) -> tuple[str, dict[str, str]]:
    """The source without magics, comments, docstrings and layout (when it parses), and its imports."""
    source = source[:MAX_SOURCE].encode("utf-8", "replace").decode("utf-8")  # lone surrogates: "?"
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    text = "\n".join(lines)
    try:
        tree = ast.parse(text)
        return ast.unparse(_DropStrings().visit(tree)), _imports(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return text, {}


def tokens(source: str, known: dict[str, str] | None = None) -> list[str]:
    """The normalised tokens of ``source``. ``known`` maps names imported elsewhere (the chapter's
    set-up cells) to what they stand for; they, builtins, keywords, attributes and keyword-argument
    names are kept, every other name becomes ``V``."""
    text, imported = _canonical(source)
    known = {**(known or {}), **imported}
    raw, first = [], {}  # first: line number -> the line's first token
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP):
                raw.append((tok.type, tok.string, tok.start[0]))
                first.setdefault(tok.start[0], tok.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # keep what was read before the error
    out, depth, header = [], [], None  # header: the bracket depth of an open def or lambda header
    for i, (kind, text, line) in enumerate(raw):
        before = raw[i - 1][1] if i else ""
        after = raw[i + 1][1] if i + 1 < len(raw) else ""
        if kind == tokenize.OP:
            if text in "([{":
                depth.append(text)
            elif text in ")]}" and depth:
                depth.pop()
            elif text == ":" and header == len(depth):
                header = None
            out.append(text)
        elif kind == tokenize.NAME:
            if text in ("def", "lambda") and header is None:
                header = len(depth)
            if before == "." or (first[line] in ("import", "from") and before != "as"):
                out.append(text)  # an attribute, or a module named by an import
            elif text in known:
                out.append(known[text])
            elif text in _KEPT:
                out.append(text)
            elif after == "=" and depth and depth[-1] == "(" and header is None:
                out.append(text)  # a keyword argument of a call: part of the API used
            else:
                out.append("V")
        elif kind == tokenize.NUMBER:
            try:
                out.append(repr(ast.literal_eval(text)))
            except (ValueError, SyntaxError):
                out.append(text)
        else:
            try:
                out.append(repr(ast.literal_eval(text)))
            except (ValueError, SyntaxError):
                out.append("S")
    return out


def _hash(gram: tuple[str, ...]) -> int:
    data = "\x00".join(gram).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def fingerprints(toks: list[str], k: int = K, window: int = WINDOW) -> frozenset[int]:
    """Winnowing: of the hashes of every ``k`` consecutive tokens, the smallest of each ``window``
    consecutive ones (the rightmost on ties). A document shorter than a window keeps its smallest."""
    hashes = [_hash(tuple(toks[i:i + k])) for i in range(len(toks) - k + 1)]
    if len(hashes) <= window:
        return frozenset([min(hashes)] if hashes else [])
    kept = set()
    for i in range(len(hashes) - window + 1):
        win = hashes[i:i + window]
        low = min(win)
        kept.add((i + window - 1 - win[::-1].index(low), low))
    return frozenset(h for _, h in kept)


def score(a: frozenset[int], b: frozenset[int]) -> float:
    """The Jaccard index of two fingerprint sets (0 when either is empty)."""
    return len(a & b) / len(a | b) if a and b else 0.0


# --- the chapter's answers ------------------------------------------------------------------

def answer_cells(nb) -> dict[str, str]:
    """grade_id -> source of each answer cell of ``nb`` (the first one, when a student duplicated it)."""
    out = {}
    for cell in nb.cells:
        meta = notebook.nbgrader_meta(cell)
        gid = meta.get("grade_id")
        if (cell.get("cell_type") == "code" and isinstance(gid, str) and meta.get("solution")
                and not meta.get("grade") and gid not in out):
            source = cell.get("source", "")
            out[gid] = "".join(source) if isinstance(source, list) else str(source)
    return out


@functools.cache
def _setup_names(chapter: str) -> dict[str, str]:
    sol = notebook.read(config.solution_path(chapter))
    out = {}
    for i in notebook.setup_cells(sol):
        out.update(_canonical(sol.cells[i].source)[1])
    return out


@functools.cache
def _stub_prints(chapter: str) -> dict[str, frozenset[int]]:
    stub = answer_cells(notebook.read(config.student_path(chapter)))
    return {ex: fingerprints(tokens(source, _setup_names(chapter))) for ex, source in stub.items()}


def prints(source: str, chapter: str, exercise: str) -> frozenset[int]:
    """The fingerprints of an answer to ``exercise``, less those of its released stub."""
    stub = _stub_prints(chapter).get(exercise, frozenset())
    return fingerprints(tokens(source, _setup_names(chapter))) - stub


@functools.cache
def reference_source(exercise: str) -> str | None:
    """Source of course_lib's top-level function named like the exercise (``ex_rope`` -> ``rope``)."""
    name = exercise.removeprefix(config.EXERCISE_PREFIX)
    for path in sorted((config.root() / "course_lib").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if f"def {name}(" not in text:
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return ast.get_source_segment(text, node)
    return None


def _student_notebook(path: Path, chapter: str):
    """The notebook at ``path``, or the reason it cannot be compared."""
    if not path.is_file():
        return "no notebook submitted"
    try:
        return notebook.submission_problem(path, chapter) or notebook.read(path)  # grading's checks
    except Exception as e:  # noqa: BLE001 (whatever one submission holds, the others are compared)
        return f"unreadable ({type(e).__name__})"


def _grading(grading_dir: Path | str | None) -> Path:
    return Path(grading_dir) if grading_dir else config.root() / "grading"


def compare(chapter: str, grading_dir: Path | str | None = None, threshold: float = THRESHOLD) -> Comparison:
    """Every pair of answers of ``chapter`` scoring ``threshold`` or more, per exercise."""
    g = _grading(grading_dir)
    solution = notebook.read(config.solution_path(chapter))
    sol = answer_cells(solution)
    out = Comparison(chapter, exercises=[ex.name for ex in notebook.exercises(solution)])
    by_student: dict[str, dict[str, str]] = {}
    for folder in sorted((g / "submitted").glob(f"*/{chapter}")):
        who = folder.parent.name
        nb = _student_notebook(folder / f"{chapter}.ipynb", chapter)
        if isinstance(nb, str):
            out.skipped[who] = nb
            continue
        try:
            by_student[who] = answer_cells(nb)
        except Exception as e:  # noqa: BLE001
            out.skipped[who] = f"unreadable cells ({type(e).__name__})"
    for ex in out.exercises:
        refs = [Answer(SOLUTION, sol[ex], prints(sol[ex], chapter, ex))]
        if (ref := reference_source(ex)) is not None:
            refs.append(Answer(REFERENCE, ref, prints(ref, chapter, ex)))
        students = []
        for who, cells in by_student.items():
            if ex not in cells:
                continue  # no answer cell: nothing to compare
            try:
                a = Answer(who, cells[ex], prints(cells[ex], chapter, ex))
            except Exception:  # noqa: BLE001 (a pathological cell: that answer alone is left out)
                continue
            if len(a.prints) >= MIN_PRINTS:
                students.append(a)
            elif a.prints:
                out.short.setdefault(ex, []).append(who)
        found = [Pair(ex, s, a, b) for a, b in itertools.chain(
            itertools.combinations(students, 2), itertools.product(students, refs))
            if (s := score(a.prints, b.prints)) >= threshold]
        out.pairs += sorted(found, key=lambda p: (-p.score, p.a.who, p.b.who))
    return out


def similar_column(chapter: str, grading_dir: Path | str | None = None) -> dict[str, str]:
    """Student -> ``"ex_rope: 0.93 with Jane_Doe_1001; ..."`` (the best match per exercise), ``""``
    for no match, ``"not compared: why"`` for a submission that could not be read."""
    result = compare(chapter, grading_dir)
    best: dict[str, dict[str, tuple[float, str]]] = {}
    for p in result.pairs:
        for me, other in ((p.a, p.b), (p.b, p.a)):
            if me.who in (SOLUTION, REFERENCE):
                continue
            mine = best.setdefault(me.who, {})
            if p.exercise not in mine or p.score > mine[p.exercise][0]:
                mine[p.exercise] = (p.score, other.who)
    g = _grading(grading_dir)
    everyone = {f.parent.name for f in (g / "submitted").glob(f"*/{chapter}")}
    out = {who: "" for who in everyone}
    out.update({who: f"not compared: {why}" for who, why in result.skipped.items()})
    for who, per_ex in best.items():
        out[who] = "; ".join(f"{ex}: {s:.2f} with {other}" for ex, (s, other) in per_ex.items())
    return dict(sorted(out.items()))


# --- the report -----------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:1.5em}h2{margin-top:2em}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:1em;margin:.5em 0 1.5em}
pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:85%;margin:0}
.score{font-weight:bold}.ref{color:#555}"""


def _e(text: str) -> str:
    return html.escape(text.encode("utf-8", "backslashreplace").decode("utf-8"), quote=True)


def render(result: Comparison) -> str:
    """The report of :func:`compare` as one self-contained HTML page."""
    chapter = _e(result.chapter)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Similarity: {chapter}</title>"
             f"<style>{_CSS}</style></head><body><h1>Similarity of answers: {chapter}</h1>",
             f"<p>Pairs whose normalised answers share {THRESHOLD:.0%} or more of their fingerprints "
             f"(Jaccard index of winnowed {K}-token hashes, the released stub removed). "
             f"'{SOLUTION}' is the public solution, '{REFERENCE}' the library's reference function. "
             "A high score is a reason to look, not a verdict.</p>"]
    if result.skipped:
        parts.append("<h2>Not compared</h2><ul>" + "".join(
            f"<li>{_e(who)}: {_e(why)}</li>" for who, why in sorted(result.skipped.items())) + "</ul>")
    counts = {ex: sum(p.exercise == ex for p in result.pairs) for ex in result.exercises}
    parts.append("<ul>" + "".join(f"<li><a href='#{_e(ex)}'>{_e(ex)}</a>: {n} pair(s)</li>"
                                  for ex, n in counts.items()) + "</ul>")
    for ex in result.exercises:
        pairs = [p for p in result.pairs if p.exercise == ex]
        parts.append(f"<h2 id='{_e(ex)}'>{_e(ex)}: {len(pairs)} pair(s)</h2>")
        if ex in result.short:
            parts.append(f"<p class='ref'>Too short to compare: {_e(', '.join(result.short[ex]))}</p>")
        for p in pairs:
            parts.append(f"<p><span class='score'>{p.score:.2f}</span> {_e(p.a.who)} and {_e(p.b.who)}</p>"
                         f"<div class='pair'><pre>{_e(p.a.source)}</pre><pre>{_e(p.b.source)}</pre></div>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(chapter: str, grading_dir: Path | str | None = None) -> Path:
    """Write ``<grading>/similarity/<chapter>.html`` and return its path."""
    g = _grading(grading_dir)
    path = g / "similarity" / f"{chapter}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(compare(chapter, g)), encoding="utf-8", errors="backslashreplace")
    return path
