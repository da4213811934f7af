"""What the formgrader and the feedback show of a submission: nothing that runs, no hidden test.

**Grader side**: runs in the grader's own process, never beside student code.

Two nbgrader preprocessors, registered in ``nbgrader_config.py``:

- :class:`SanitizeOutputs` runs in ``autograde`` right after the sandboxed execution, so the
  autograded notebook (which the formgrader renders, and feedback is made from) is inert:

  * outputs keep only ``text/plain``, ``image/png`` and ``image/jpeg``; anything else (HTML,
    markdown, LaTeX, JavaScript, SVG, widgets) is dropped, and an output left empty says so:
    ``[output of type text/html removed by the grader]``. Output metadata goes too (it can set
    an image's ``src``). Error outputs stay as they are: they decide the points;
  * a markdown or raw cell that is not word for word one of the instructor's (source or
    release notebook of the chapter) becomes a markdown cell holding it in a fenced code block,
    so it shows as literal text (``html.escape`` alone would keep ``[x](javascript:...)`` links
    live, and a raw cell's format can be HTML);
  * notebook widget state is dropped (the HTML template embeds it in a ``<script>``).

- :class:`NameGrades` (nbgrader's ``GetGrades``, extended) labels each graded cell for the
  feedback page (``templates/feedback/course_feedback.html.j2``) by its exercise, as the self-check names it
  (``ex_lr_at: tests``, ``ex_weight_tying: written answer``), and marks a written answer that no
  one has graded yet, which the page shows as "not graded yet" rather than "Score 0.0 / 2.0".

- :class:`HideTests` runs in ``generate_feedback``, after :class:`SanitizeOutputs` once more
  (a no-op on a notebook it has seen; it covers ones autograded without it). Each hidden block
  of a cell becomes the one line ``# (hidden tests)``, a test cell's traceback (IPython prints
  the source lines) becomes ``ename: evalue``, and any output of any cell that contains a line
  of a hidden block (a submission can read the test cell's source at run time and print it)
  is replaced by a note.

  :class:`HideTests` also bounds the page (a submission whose cells raise 50 MB errors made a
  200 MB page): each output keeps at most :data:`MAX_OUTPUT_CHARS` characters of text and an
  image at most :data:`MAX_IMAGE_CHARS` of base64, a cell's source :data:`MAX_SOURCE_CHARS`, the
  whole page :data:`MAX_PAGE_CHARS` of outputs; what is cut says so ("... 48,213,112 more
  characters not shown"). And it renders each written answer (a student's markdown cell, kept
  literal by :class:`SanitizeOutputs`) as Markdown with raw HTML escaped and no image loaded
  (:func:`student_markdown`), for the page's template to show instead of the literal block.

The line match ignores whitespace, colours and invisible characters, but a submission that
prints the captured tests transformed (reversed, encoded) gets past it: the hidden tests are
protected by the sandbox first; this keeps them out of the ordinary paths into the HTML.
"""

from __future__ import annotations

import copy
import functools
import re
import unicodedata
from pathlib import Path

import nbformat
from nbformat.v4 import new_output
from nbgrader.preprocessors import GetGrades, NbGraderPreprocessor

from course_tools import config
from course_tools.grading.grader.safe_text import ANSI
from course_tools.notebook import HIDDEN_BEGIN, HIDDEN_END, HIDDEN_PLACEHOLDER, hide_blocks  # noqa: F401

SAFE_MIMETYPES = ("text/plain", "image/png", "image/jpeg")
MIN_SECRET_CHARS = 10  # shorter lines (``)``, ``else:``) say nothing and would match anything
REDACTED = "[output removed by the grader: it showed hidden test code]"

_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_ANSI = ANSI
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.]{0,99}")


def _text(value) -> str:
    """nbformat keeps multi-line strings as lists on disk; a hostile file may hold anything."""
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return value if isinstance(value, str) else ""


def _chapter(resources) -> str | None:
    """The chapter being graded: nbgrader's assignment id, when it names one of ours."""
    name = (resources or {}).get("nbgrader", {}).get("assignment")
    return name if isinstance(name, str) and config.CHAPTER_RE.match(name) else None


@functools.lru_cache(maxsize=16)
def _instructor_notebooks(chapter: str | None) -> dict[str, nbformat.NotebookNode]:
    """The chapter's ``"source"`` and ``"release"`` notebooks that exist (none when unknown).
    Shared between calls: read them, never change them."""
    if chapter is None:
        return {}
    try:
        paths = {"source": config.solution_path(chapter), "release": config.student_path(chapter)}
    except FileNotFoundError:  # no course folder: every cell counts as the student's
        return {}
    return {k: nbformat.read(str(p), as_version=4) for k, p in paths.items() if p.is_file()}


# --- SanitizeOutputs -------------------------------------------------------------------------


def removed_note(kinds) -> str:
    return f"[output of type {', '.join(sorted(kinds)) or 'unknown'} removed by the grader]"


def _safe_value(mimetype: str, value) -> str | None:
    text = _text(value)
    if mimetype == "text/plain":
        return text
    return text if text and _BASE64.fullmatch(text) else None  # images: base64 or nothing


def sanitize_output(output) -> nbformat.NotebookNode:
    """One output with only inert content; errors are returned unchanged.

    ``{"output_type": "display_data", "data": {"text/html": "<script>..."}}`` ->
    ``{"output_type": "display_data", "data": {"text/plain": "[output of type text/html removed
    by the grader]"}, "metadata": {}}``
    """
    kind = output.get("output_type")
    if kind == "error":
        return output
    if kind == "stream":  # stderr stays stderr: it costs a test cell its points
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return new_output("stream", name=name, text=_text(output.get("text")))
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    kept = {m: v for m in SAFE_MIMETYPES if m in data and (v := _safe_value(m, data[m])) is not None}
    if not kept:
        kept = {"text/plain": removed_note(data.keys() if data else [str(kind)])}
    if kind == "execute_result":
        count = output.get("execution_count")
        return new_output(kind, data=kept, execution_count=count if isinstance(count, int) else None)
    return new_output("display_data", data=kept)


STUDENT_FENCE_INFO = "student-text"  # names a student's text in a fence: not the instructor's


def literal_markdown(text: str) -> str:
    """Markdown that renders ``text`` verbatim: a fence longer than any backtick run inside.

    ``'<script>x</script>'`` -> ``'```student-text\\n<script>x</script>\\n```'`` (the renderer
    escapes it; the feedback page renders the text inside with :func:`student_markdown`)
    """
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{STUDENT_FENCE_INFO}\n{text}\n{fence}"


def literal_text(source: str) -> str | None:
    """The student's text inside a block :func:`literal_markdown` made, else None."""
    match = re.fullmatch(r"(`{3,})" + STUDENT_FENCE_INFO + r"\n(.*)\n\1", source, flags=re.DOTALL)
    return match.group(2) if match and literal_markdown(match.group(2)) == source else None


def _is_literal(source: str) -> bool:
    """Already a single fenced block nothing inside can close (keeps sanitising idempotent)."""
    return literal_text(source) is not None


@functools.cache
def _student_renderer():
    from markdown_it import MarkdownIt

    # html=False: a tag the student wrote is shown as text; links to javascript: and the like
    # are refused by markdown-it; images are not loaded at all (a page opened offline, and no
    # tracking pixel): ``![x](url)`` reads as "!" and a link.
    return MarkdownIt("commonmark", {"html": False}).enable("table").disable("image")


def student_markdown(text: str) -> str:
    """A student's written answer as HTML that runs and loads nothing: ``"**Because** <b>x</b>"``
    -> ``"<p><strong>Because</strong> &lt;b&gt;x&lt;/b&gt;</p>\\n"``. Math stays as its TeX."""
    return _student_renderer().render(text)


def _instructor_texts(chapter: str | None) -> set[tuple[str, str]]:
    return {(c.cell_type, _text(c.source)) for nb in _instructor_notebooks(chapter).values()
            for c in nb.cells if c.cell_type in ("markdown", "raw")}


class SanitizeOutputs(NbGraderPreprocessor):
    """nbgrader preprocessor: outputs and student-written text that render as inert HTML."""

    def preprocess(self, nb, resources):
        trusted = _instructor_texts(_chapter(resources))
        for cell in nb.cells:
            source = _text(cell.get("source"))
            if cell.cell_type == "code":
                cell.outputs = [sanitize_output(o) for o in cell.get("outputs", [])]
                if not isinstance(cell.get("execution_count"), int):
                    cell.execution_count = None
            elif (cell.cell_type, source) in trusted:
                continue
            elif cell.cell_type == "markdown" and _is_literal(source):
                continue
            elif cell.cell_type in ("markdown", "raw"):  # a raw cell's own format could be HTML
                cell.cell_type, cell.source = "markdown", literal_markdown(source)
                cell.pop("attachments", None)
                for key in ("format", "raw_mimetype"):
                    cell.metadata.pop(key, None)
        nb.metadata.pop("widgets", None)
        return nb, resources


# --- HideTests -------------------------------------------------------------------------------


def _split_lines(source: str) -> tuple[list[str], list[str]]:
    """(lines inside hidden blocks, lines outside them), markers left out."""
    inside, outside, hiding = [], [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line or HIDDEN_END in line:
            hiding = HIDDEN_BEGIN in line
        else:
            (inside if hiding else outside).append(line)
    return inside, outside


def squash(text: str) -> str:
    """``text`` without colours, whitespace or invisible characters, for matching.

    ``'\\x1b[31m_check(q,\\n k)\\x1b[0m'`` -> ``'_check(q,k)'``
    """
    text = unicodedata.normalize("NFKC", _ANSI.sub("", text))
    return "".join(ch for ch in text if unicodedata.category(ch)[0] not in "CZ")


def secret_lines(cells, public_cells=()) -> set[str]:
    """Squashed lines of the hidden blocks in ``cells`` that the students cannot see anyway
    (lines also outside the blocks of ``public_cells`` are left out), each long enough to mean
    something."""
    secret, public = set(), set()
    for cell in cells:
        secret.update(squash(line) for line in _split_lines(_text(cell.get("source")))[0])
    for cell in public_cells:
        public.update(squash(line) for line in _split_lines(_text(cell.get("source")))[1])
    return {line for line in secret - public if len(line) >= MIN_SECRET_CHARS}


def _output_text(output) -> str:
    if output.get("output_type") == "stream":
        return _text(output.get("text"))
    if output.get("output_type") == "error":
        return "\n".join([_text(output.get("ename")), _text(output.get("evalue")),
                          *map(_text, output.get("traceback") or [])])
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    return "\n".join(_text(v) for m, v in data.items() if not m.startswith("image/"))


def redact(output) -> nbformat.NotebookNode:
    """The output with its content replaced by :data:`REDACTED` (an error keeps its kind)."""
    kind = output.get("output_type")
    if kind == "error":
        ename = _text(output.get("ename"))
        ename = ename if _IDENTIFIER.fullmatch(ename) else "Error"
        return new_output("error", ename=ename, evalue=REDACTED, traceback=[f"{ename}: {REDACTED}"])
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return new_output("stream", name=name, text=REDACTED + "\n")
    return new_output("display_data", data={"text/plain": REDACTED})


def _block(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _is_test_cell(cell) -> bool:
    meta = _block(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


class HideTests(NbGraderPreprocessor):
    """nbgrader preprocessor for feedback: no hidden test in sources, tracebacks or outputs."""

    def preprocess(self, nb, resources):
        instructor = _instructor_notebooks(_chapter(resources))
        source = instructor["source"].cells if "source" in instructor else []
        # Lines the release shows, or the visible part of a test cell, are no secret.
        public = [c for c in nb.cells if _block(c).get("locked")]
        public += instructor["release"].cells if "release" in instructor else []
        secrets = secret_lines([*nb.cells, *source], public)
        page = {"left": MAX_PAGE_CHARS}
        rendered = resources.setdefault("course", {}).setdefault("student_markdown", {})
        for cell in nb.cells:
            if HIDDEN_BEGIN in _text(cell.get("source")):
                cell.source = hide_blocks(_text(cell.source))
            if cell.cell_type == "markdown" and (text := literal_text(_text(cell.source))) is not None:
                cell.source = literal_markdown(cut(text, MAX_SOURCE_CHARS))
                rendered[cell.source] = student_markdown(cut(text, MAX_SOURCE_CHARS))
            elif cell.cell_type == "code":
                cell.source = cut(_text(cell.source), MAX_SOURCE_CHARS)
            if cell.cell_type != "code":
                continue
            outputs = []
            for output in cell.get("outputs", []):
                if _is_test_cell(cell) and output.get("output_type") == "error":
                    ename, evalue = _text(output.get("ename")), _text(output.get("evalue"))
                    output = new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
                # Matched on twice what is kept, so that a hidden line the cut goes through is seen whole.
                text = squash(_output_text(cap_output(output, 2 * MAX_OUTPUT_CHARS)))
                output = redact(output) if any(s in text for s in secrets) else cap_output(output)
                outputs.append(_within_page(output, page))
            cell.outputs = outputs
        return nb, resources


# --- Bounds of the page ----------------------------------------------------------------------

MAX_OUTPUT_CHARS = 20_000  # text kept of one output (a stream, an error, a result)
MAX_IMAGE_CHARS = 2_000_000  # base64 characters of one image (1.5 MB)
MAX_SOURCE_CHARS = 100_000  # characters of one cell's source
MAX_PAGE_CHARS = 8_000_000  # characters of all outputs of a page


def cut(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text`` up to ``limit`` characters, then how many were left out:
    ``cut("abcdef", 2) == "ab\\n... 4 more characters not shown"``."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... {len(text) - limit:,} more characters not shown"


def cap_output(output, limit: int = MAX_OUTPUT_CHARS) -> nbformat.NotebookNode:
    """The output with its text cut to ``limit`` characters (an error: its value, and its
    traceback as a whole) and an image over :data:`MAX_IMAGE_CHARS` replaced by a note."""
    output = copy.deepcopy(output)
    kind = output.get("output_type")
    if kind == "stream":
        output["text"] = cut(_text(output.get("text")), limit)
    elif kind == "error":
        output["evalue"] = cut(_text(output.get("evalue")), limit)
        lines, left = [], limit
        for line in map(_text, output.get("traceback") or []):
            lines.append(cut(line, max(left, 0)) if len(line) > left else line)
            left -= len(line)
            if left < 0:
                break
        output["traceback"] = lines
    elif isinstance(output.get("data"), dict):
        for mime, value in list(output["data"].items()):
            value = _text(value)
            if mime.startswith("image/") and len(value) > MAX_IMAGE_CHARS:
                del output["data"][mime]
                note = (f"[image not shown: {len(value):,} characters, more than the "
                        f"{MAX_IMAGE_CHARS:,} a feedback page keeps per image]")
                output["data"]["text/plain"] = note
            elif not mime.startswith("image/"):
                output["data"][mime] = cut(value, limit)
    return output


def _size(output) -> int:
    data = output.get("data") if isinstance(output.get("data"), dict) else {}
    return len(_output_text(output)) + sum(len(_text(v)) for m, v in data.items() if m.startswith("image/"))


def _within_page(output, page: dict) -> nbformat.NotebookNode:
    """The output while the page has room for it, else a note that it was left out."""
    size = _size(output)
    if size > page["left"]:
        page["left"] = 0
        note = (f"[output not shown: {size:,} characters, more than the page has left of the "
                f"{MAX_PAGE_CHARS:,} characters of output a feedback page keeps]")
        return new_output("stream", name="stdout", text=note + "\n")
    page["left"] -= size
    return output


TEMPLATES = str(Path(__file__).parent / "templates")  # the feedback page: feedback/course_feedback.html.j2


def grade_label(grade_id: str, cell) -> str:
    """How the feedback page names a graded cell: by its exercise, as the self-check does."""
    if cell.get("cell_type") == "code" and not cell.metadata.nbgrader.get("solution"):
        return f"{grade_id.removesuffix(config.TEST_SUFFIX)}: tests"
    return f"{grade_id}: written answer" if cell.get("cell_type") == "markdown" else f"{grade_id}: answer"


class NameGrades(GetGrades):
    """nbgrader's GetGrades, plus a label per graded cell and ``pending`` for a grade that still
    waits for a person (``resources['nbgrader']['pending_points']`` sums their points)."""

    def _get_score(self, cell, resources):
        meta = cell.metadata.nbgrader
        grade = self.gradebook.find_grade(meta["grade_id"], self.notebook_id, self.assignment_id,
                                          self.student_id)
        meta["score"], meta["points"] = grade.score, grade.max_score
        meta["pending"] = bool(grade.needs_manual_grade)
        meta["label"] = grade_label(meta["grade_id"], cell)
        pending = resources["nbgrader"].get("pending_points", 0.0)
        resources["nbgrader"]["pending_points"] = pending + (grade.max_score if meta["pending"] else 0.0)
