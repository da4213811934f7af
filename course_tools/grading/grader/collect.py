"""Collect: file the notebooks a learning-management system exports, ready for grading.

**Grader side**: runs in the grader's own process, never beside student code.

    python -m course_tools collect 01_tokenization submissions.zip
    python -m course_tools collect 01_tokenization folder/ --pattern '(?P<student>[^_]+)_.*'

The source is a zip file or a folder. A file at its top is matched to a student by its name,
with the first of these patterns that fits (or your own ``--pattern``, with a ``student`` and/or
an ``id`` group, and optionally a ``timestamp`` group); a file in a folder belongs to that top
folder, whatever the file is called (one folder wrapping the whole export is looked through).
The student's folder is keyed by the LMS's own id, so two students with the same name stay two:

============  =====================================================  =======================
LMS           file name                                              student folder
============  =====================================================  =======================
Blackboard    ``HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb``       ``jdoe``
Moodle        ``Jane Doe_1234_assignsubmission_file_nb.ipynb``        ``Jane_Doe_1234``
              (or a folder ``Jane Doe_1234_assignsubmission_file_/``)
Canvas        ``doejane_12345_67890_nb.ipynb`` (``late_`` allowed)    ``doejane_12345``
a folder      ``jdoe/anything.ipynb``                                 ``jdoe``
============  =====================================================  =======================

Names keep their letters in any script (``王小明_1235``, ``Zoë_Ørsted_1234``); a control character
in a name (a newline, a right-to-left override) becomes a space. A ``/`` in a name (``<b>X</b>_1234_
assignsubmission_file_nb.ipynb``) cuts it into folders; the pieces that match an LMS's naming
together are joined again, so the student keeps the LMS id. Two raw names that give the same
folder are kept apart as ``X``, ``X-2``, ... and reported.

What this module guarantees, for a hostile export and a collector running as root:

- only regular files are read: symlinks, hard links, FIFOs, devices and sockets in a folder, and
  symlink entries in a zip, are reported and never opened; a zip is never extracted, names with
  ``..`` or an absolute path are refused, and at most ``MAX_NOTEBOOK_BYTES`` are read per file;
- every student in the export gets a row and a folder ``<grading>/submitted/<student>/<chapter>/``,
  holding ``<chapter>.ipynb`` (the latest notebook by the LMS's timestamp, else the zip entry's
  date, else the file's mtime), or empty with the problem said in the manifest; latest notebooks
  of one time that differ are such a problem, never a choice;
- writes under the grading folder never pass through a symlink (a graded submission could have
  planted one), and a re-collect starts from an emptied ``<student>/<chapter>/`` folder;
- ``<grading>/collected/<chapter>.json`` (see ``manifest``) lists every student of the export
  (name, LMS id, source file, time, problem) and every file not used; students collected from
  an earlier export keep their rows. Folder sources rely on POSIX ``O_NOFOLLOW`` and ``dir_fd``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import unicodedata
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path, PurePosixPath

from course_tools import config
from course_tools.grading.grader import safe_text

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024  # a real notebook is far smaller; more is an attack or a mistake
MAX_TIED = 10  # more of a student's notebooks with one time are no accident: a problem, unread
PATTERNS = {
    "blackboard": r"^.+?_(?P<id>[^_]+)_attempt_(?P<timestamp>[0-9-]+)_.+$",
    "moodle": r"^(?P<student>.+?)_(?P<id>\d+)_assignsubmission_file(?:_.*)?$",
    "canvas": r"^(?P<student>[^\W_]+)_(?:late_)?(?P<id>\d+)_\d+_.+$",
}
NOT_REGULAR = "not a regular file"
NAMING_HELP = """file names understood (the first that fits; a file in a folder belongs to its top folder):
  blackboard  HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb     -> jdoe
  moodle      Jane Doe_1234_assignsubmission_file_nb.ipynb      -> Jane_Doe_1234
              (or a folder "Jane Doe_1234_assignsubmission_file_/")
  canvas      doejane_12345_67890_nb.ipynb (late_ allowed)      -> doejane_12345
  a folder    jdoe/anything.ipynb                               -> jdoe
anything else: pass --pattern, e.g. --pattern '(?P<student>[^_]+)_.*'"""


@dataclass(frozen=True)
class Student:
    name: str  # display name as the LMS wrote it, NFC ("Jane Doe")
    lms_id: str | None  # the LMS's own id ("1234"); None for a folder per student

    @property
    def key(self) -> str:
        """Folder name: ``Student("Jane Doe", "1234").key == "Jane_Doe_1234"``."""
        parts = [_cut(normalise(self.name), 150)]  # bytes: a file name holds at most 255
        if self.lms_id is not None and self.lms_id != self.name:
            parts.append(_cut(normalise(self.lms_id), 60))
        return "_".join(p for p in parts if p) or "unknown"


# Characters that would break a name's line or reorder its text: controls (newline, tab, escape),
# line and paragraph separators, bidirectional overrides and isolates.
UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def readable(text: str) -> str:
    """``text`` in NFC with a space for each character that would break its line or reorder it,
    and U+FFFD for a byte of a file name that is not UTF-8 (a lone surrogate, which no file or
    terminal takes): ``"Jane\\nDoe" -> "Jane Doe"``."""
    return UNPRINTABLE.sub(" ", unicodedata.normalize("NFC", safe_text.no_surrogates(text)))


def normalise(name: str) -> str:
    """A folder name that keeps letters of every script: ``" Zoë  Ørsted?" -> "Zoë_Ørsted"``."""
    name = re.sub(r"\s+", "_", unicodedata.normalize("NFC", name).strip())
    return "".join(c for c in name if c.isalnum() or c in "-._").lstrip(".")


def _cut(text: str, max_bytes: int) -> str:
    while len(text.encode()) > max_bytes:
        text = text[:-1]
    return text


def _timestamp(text: str | None) -> datetime | None:
    """``"2026-11-20-10-00-00" -> datetime(2026, 11, 20, 10, 0)``; None if it is not a date."""
    digits = re.sub(r"\D", "", text or "")
    try:
        return datetime.strptime(digits.ljust(14, "0")[:14], "%Y%m%d%H%M%S") if digits else None
    except ValueError:
        return None


def _match(name: str, patterns: list[str]) -> tuple[Student, datetime | None] | None:
    for p in patterns:
        m = re.match(p, readable(name))
        if m:
            found = m.groupdict()
            if "student" not in found and "id" not in found:
                raise SystemExit(f"The pattern {p!r} needs a 'student' or an 'id' group.")
            raw = found["student"] if "student" in found else found["id"]
            return Student((raw or "").strip(), found.get("id")), _timestamp(found.get("timestamp"))
    return None


def _folder_student(name: str) -> tuple[Student, datetime | None]:
    """A Moodle folder ``Jane Doe_1234_assignsubmission_file_``, else any folder name as is."""
    return _match(name, list(PATTERNS.values())) or (Student(readable(name), None), None)


def student_of(relpath: str, pattern: str | None = None,
               wrapper: str | None = None) -> tuple[Student, datetime | None] | None:
    """(student, the pattern's timestamp) for a file's path in the export, or None.

    ``relpath`` is inside ``wrapper``, a folder holding the whole export if there is one. With
    ``pattern``, only the file name counts. Otherwise a file in a folder belongs to its top
    folder (``jdoe/work/nb.ipynb`` -> ``jdoe``, whatever the file is called); a file at the top
    is matched by its name, else belongs to the wrapper (a one-student export)."""
    parts = PurePosixPath(relpath).parts
    if pattern:
        return _match(parts[-1], [pattern])
    if len(parts) >= 2:
        return _match(parts[0], list(PATTERNS.values())) or _split_name(parts) or _folder_student(parts[0])
    return _match(parts[0], list(PATTERNS.values())) or (_folder_student(wrapper) if wrapper else None)


def _split_name(parts: tuple[str, ...]) -> tuple[Student, datetime | None] | None:
    """An LMS name that a ``/`` in the student's name cut into folders: ``("<b>Xss<", "b> =1+1_1234_
    assignsubmission_file_nb.ipynb")`` -> Student("<b>Xss</b> =1+1", "1234"), the shortest
    rejoined prefix that an LMS pattern matches; None if none does."""
    for k in range(2, len(parts) + 1):
        found = _match("/".join(parts[:k]), list(PATTERNS.values()))
        if found:
            return found
    return None


def _wrapper(rels: list[str]) -> str | None:
    """The one folder that holds every file of the export (``export/jdoe/nb.ipynb``), if any."""
    tops = {PurePosixPath(r).parts[0] for r in rels}
    if len(tops) == 1 and all(len(PurePosixPath(r).parts) >= 2 for r in rels):
        return tops.pop()
    return None


@dataclass(frozen=True, eq=False)  # compared by identity
class Entry:
    rel: str  # path inside the export, with /
    time: datetime | None  # zip entry date or file mtime; the pattern's timestamp replaces it
    problem: str | None  # why it must not be read (NOT_REGULAR), else None
    open: Callable[[], contextlib.AbstractContextManager]  # binary stream; only for the chosen file


def _folder_entries(root: Path, report: Report) -> Iterator[Entry]:
    def rel(path: str) -> str:
        return Path(path).relative_to(root).as_posix()

    def unlisted(e: OSError) -> None:
        report.skipped.append((rel(e.filename), f"could not be listed ({e.strerror})"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlisted, followlinks=False):
        dirnames.sort()
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):  # walk lists but never enters it
                report.skipped.append((rel(os.path.join(dirpath, name)), NOT_REGULAR))
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            # A hard link (nlink > 1) may be a classmate's file or the gradebook.
            regular = stat.S_ISREG(st.st_mode) and st.st_nlink == 1
            try:
                mtime = datetime.fromtimestamp(st.st_mtime)
            except (OverflowError, OSError, ValueError):  # a forged mtime far outside any calendar
                mtime = None
            yield Entry(rel(path), mtime, None if regular else NOT_REGULAR,
                        lambda p=path, s=st: _open_regular(p, s))


def _open_regular(path: str, expected: os.stat_result):
    # O_NOFOLLOW and O_NONBLOCK: a file swapped for a symlink or FIFO since the lstat fails or
    # returns at once; fstat then proves it is still the same regular file.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_ino != expected.st_ino:
        os.close(fd)
        raise OSError(f"{path} changed while it was collected")
    return os.fdopen(fd, "rb")


def _zip_name(info: zipfile.ZipInfo) -> str:
    """The entry's name; UTF-8 names written without the UTF-8 flag are decoded as UTF-8."""
    if info.flag_bits & 0x800:
        return info.filename
    with contextlib.suppress(UnicodeError):
        return info.filename.encode("cp437").decode("utf-8")
    return info.filename


def _zip_entries(z: zipfile.ZipFile, report: Report) -> Iterator[Entry]:
    for info in z.infolist():
        if info.is_dir():
            continue
        name = _zip_name(info)
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if not parts or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
            report.skipped.append((name, "unsafe path in the zip"))
            continue
        kind = stat.S_IFMT(info.external_attr >> 16)  # 0: the zipper recorded no file type
        try:
            time = datetime(*info.date_time)
        except ValueError:
            time = None
        yield Entry("/".join(parts), time, None if kind in (0, stat.S_IFREG) else NOT_REGULAR,
                    lambda i=info: z.open(i))


def _read_bounded(entry: Entry) -> bytes | None:
    """The entry's bytes, or None if it holds more than MAX_NOTEBOOK_BYTES (sizes in headers lie)."""
    chunks, size = [], 0
    with entry.open() as f:
        while size <= MAX_NOTEBOOK_BYTES:
            chunk = f.read(1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
    return None


@contextlib.contextmanager
def _entries(source: Path, report: Report) -> Iterator[list[Entry]]:
    """Every file of the export; hidden files and macOS metadata are reported, not returned."""
    with contextlib.ExitStack() as stack:
        if source.is_dir():
            found = list(_folder_entries(source, report))
        elif zipfile.is_zipfile(source):
            found = list(_zip_entries(stack.enter_context(zipfile.ZipFile(source)), report))
        else:
            raise SystemExit(f"{source} is neither a folder nor a zip file.")
        kept = []
        for e in found:
            parts = PurePosixPath(e.rel).parts
            if any(p.startswith(".") or p == "__MACOSX" for p in parts):
                report.skipped.append((e.rel, "hidden or macOS metadata file"))
            else:
                kept.append(e)
        yield kept


@dataclass
class Report:
    students: dict[str, dict] = field(default_factory=dict)  # folder -> manifest row
    unmatched: list[str] = field(default_factory=list)  # notebooks matching no student
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why it was not used)
    superseded: list[str] = field(default_factory=list)  # older notebooks of a student, and copies
    renamed: list[str] = field(default_factory=list)  # folders given a -2, -3, ... suffix

    @property
    def collected(self) -> dict[str, str]:
        """Student folder -> source file, for the students whose notebook was filed."""
        return {k: row["source"] for k, row in self.students.items() if not row["problem"]}

    def lines(self) -> list[str]:
        out = [f"Collected {len(self.collected)} students."]
        out += [f"  {k}: {row['problem']}" for k, row in self.students.items() if row["problem"]]
        out += [f"  two students share a folder name, kept apart as: {readable(k)}" for k in self.renamed]
        out += [f"  could not match a student to: {readable(f)}" for f in self.unmatched]
        out += [f"  {why}, skipped: {readable(f)}" for f, why in self.skipped]
        out += [f"  superseded by a later or identical file: {readable(f)}" for f in self.superseded]
        return out


def collect(chapter: str, source: Path, grading_dir: Path | None = None,
            pattern: str | None = None) -> Report:
    """File every student's latest notebook of ``chapter`` from an LMS export; write the manifest."""
    if chapter not in config.chapters():
        raise SystemExit(f"Unknown chapter {chapter!r}; expected one of {config.chapters()}.")
    source = Path(source)
    if not source.exists():
        raise SystemExit(f"No such file or folder: {source}")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as e:
            raise SystemExit(f"--pattern {pattern!r} is not a regular expression: {e}") from e
    grading_dir = Path(grading_dir or config.root() / "grading")
    grading_dir.mkdir(parents=True, exist_ok=True)
    earlier = manifest(chapter, grading_dir)
    report = Report()
    with _entries(source, report) as entries:
        wrapper = _wrapper([e.rel for e in entries])
        files: dict[Student, list[Entry]] = {}
        for e in entries:
            inside = e.rel.split("/", 1)[1] if wrapper else e.rel
            match = student_of(inside, pattern, wrapper)
            if match is None:
                if e.rel.lower().endswith(".ipynb"):
                    report.unmatched.append(e.rel)
                else:
                    report.skipped.append((e.rel, e.problem or "not a notebook"))
                continue
            student, timestamp = match
            files.setdefault(student, []).append(replace(e, time=timestamp or e.time))
        for student, key in _folders(files, earlier["students"], report).items():
            report.students[key] = _file_one(student, files[student], grading_dir, key, chapter, report)
    students = {k: v for k, v in earlier["students"].items() if k not in report.students}
    students.update(report.students)
    _write_manifest(grading_dir, chapter, {
        "chapter": chapter, "students": dict(sorted(students.items())),
        "unmatched": report.unmatched,
        "skipped": [{"source": f, "reason": why} for f, why in report.skipped],
        "superseded": report.superseded,
    })
    return report


def _folders(files: dict[Student, list[Entry]], earlier: dict[str, dict],
             report: Report) -> dict[Student, str]:
    """A folder per student; one already held by another student (here or in an earlier export)
    gets the first free suffix ``-2``, ``-3``, ..."""
    owner = {k: Student(row.get("name", k), row.get("lms_id")) for k, row in earlier.items()}
    taken: dict[Student, str] = {}
    for student in sorted(files, key=lambda s: (s.key, s.name, s.lms_id or "")):
        key, n = student.key, 1
        while owner.get(key, student) != student:
            n += 1
            key = f"{student.key}-{n}"
        if n > 1:
            report.renamed.append(f"{key} ({student.name!r}, id {student.lms_id})")
        owner[key], taken[student] = student, key
    return taken


def _file_one(student: Student, entries: list[Entry], grading_dir: Path, key: str, chapter: str,
              report: Report) -> dict:
    """Copy the student's latest notebook into their folder; return their manifest row. Latest
    notebooks of the same time that differ are a problem for a person, never a guess."""
    def when(e: Entry) -> datetime:
        return e.time or datetime.min

    notebooks = sorted((e for e in entries if e.problem is None and e.rel.lower().endswith(".ipynb")),
                       key=lambda e: (when(e), e.rel))
    report.skipped += [(e.rel, e.problem or "not a notebook") for e in entries if e not in notebooks]
    tied = [e for e in notebooks if when(e) == when(notebooks[-1])]
    report.superseded += [e.rel for e in notebooks if e not in tied]
    latest = tied[-1] if tied else None
    row = {"name": student.name, "lms_id": student.lms_id, "source": latest and latest.rel,
           "submitted_at": latest and latest.time and latest.time.isoformat(timespec="seconds"),
           "problem": None}
    if latest is None:
        found = [PurePosixPath(e.rel).name + (f" ({e.problem})" if e.problem else "") for e in entries]
        row["problem"] = f"no notebook in the submission (found: {_some(found)})"
    try:
        folder = _fresh_dir(grading_dir, "submitted", key, chapter)
        try:
            if latest is not None:
                # A student's thousand copies are not read: never more than MAX_TIED files.
                data = _read_bounded(latest) if len(tied) <= MAX_TIED else None
                why = (f"more than {MAX_TIED}" if len(tied) > MAX_TIED else
                       "they differ" if any(_read_bounded(e) != data for e in tied[:-1]) else None)
                if why:
                    row["source"] = None
                    row["problem"] = (f"{len(tied)} notebooks submitted at the same time "
                                      f"({_some([e.rel for e in tied])}), {why}: remove all but the "
                                      "one to grade from the export, then collect again")
                elif data is None:
                    row["problem"] = f"the notebook is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB"
                else:
                    _write_new(folder, f"{chapter}.ipynb", data)
                    report.superseded += [e.rel for e in tied[:-1]]  # the same notebook again
        finally:
            os.close(folder)
    except Exception as e:  # noqa: BLE001 (one student's broken file never stops the others)
        row["problem"] = f"could not file the notebook ({type(e).__name__}: {str(e)[:200]})"
    return row


def _some(names: list[str], shown: int = 5) -> str:
    """``"a, b, c, d, e and 2 more"``, readable whatever the names hold."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return readable(", ".join(names[:shown])) + more


def _safe_dir(base: Path, *parts: str, create: bool = True) -> int:
    """An open fd of ``base/parts...``, made if missing; refuses a symlink at any of ``parts``."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                if not create and isinstance(e, FileNotFoundError):
                    raise
                raise OSError(f"{part} under {base} is a symbolic link or not a folder; refusing") from e
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fresh_dir(base: Path, *parts: str) -> int:
    """``_safe_dir``, with the last folder emptied first: a re-collect never writes into, or
    leaves beside the notebook, what an earlier collect or a graded submission put there."""
    parent = _safe_dir(base, *parts[:-1])
    try:
        try:
            shutil.rmtree(parts[-1], dir_fd=parent)  # never follows symlinks (Python >= 3.11)
        except FileNotFoundError:
            pass
        except OSError:  # a symlink or a file where the folder belongs
            os.unlink(parts[-1], dir_fd=parent)
        os.mkdir(parts[-1], 0o755, dir_fd=parent)
        return os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    finally:
        os.close(parent)


def _write_new(folder: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_manifest(grading_dir: Path, chapter: str, content: dict) -> None:
    folder = _safe_dir(grading_dir, "collected")
    try:
        tmp = f".{chapter}.json.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        text = json.dumps(content, ensure_ascii=False, indent=1) + "\n"
        _write_new(folder, tmp, text.encode("utf-8", "backslashreplace"))  # JSON escapes: reads back
        os.replace(tmp, f"{chapter}.json", src_dir_fd=folder, dst_dir_fd=folder)  # never half-written
    finally:
        os.close(folder)


def manifest(chapter: str, grading_dir: Path | None = None) -> dict:
    """The manifest of ``chapter`` written by ``collect``; an empty one if nothing was collected.

    ``{"chapter": ..., "students": {folder: {"name", "lms_id", "source", "submitted_at",
    "problem"}}, "unmatched": [file], "skipped": [{"source", "reason"}], "superseded": [file]}``"""
    grading_dir = Path(grading_dir or config.root() / "grading")
    empty = {"chapter": chapter, "students": {}, "unmatched": [], "skipped": [], "superseded": []}
    try:
        folder = _safe_dir(grading_dir, "collected", create=False)
    except FileNotFoundError:
        return empty
    try:
        fd = os.open(f"{chapter}.json", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=folder)
    except FileNotFoundError:
        return empty
    finally:
        os.close(folder)
    with os.fdopen(fd, encoding="utf-8") as f:
        try:
            return {**empty, **json.load(f)}
        except ValueError as e:
            raise SystemExit(f"{grading_dir}/collected/{chapter}.json is not valid JSON ({e}); "
                             "fix or delete it, then collect again.") from e
