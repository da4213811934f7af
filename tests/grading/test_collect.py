"""Collecting an LMS export: every student keeps a row, nothing but regular files is ever read."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import zipfile

import pytest

from course_tools import config
from course_tools.grading.grader import collect
from tests.conftest import CHAPTERS, ROOT

CHAPTER = CHAPTERS[0]
SECRET = b"-----BEGIN PRIVATE KEY----- top secret"


def submitted(grading, key):
    return grading / "submitted" / key / CHAPTER / f"{CHAPTER}.ipynb"


def make_zip(path, entries):
    """entries: (name, bytes, date_time or None)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, when in entries:
            z.writestr(zipfile.ZipInfo(name, date_time=when or (2026, 11, 20, 10, 0, 0)), data)
    return path


def every_file(folder):
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.parametrize("name, key, display, lms_id", [
    ("HW1_jdoe_attempt_2026-11-20-10-00-00_01_tokenization.ipynb", "jdoe", "jdoe", "jdoe"),
    ("Jane Doe_1234_assignsubmission_file_my work.ipynb", "Jane_Doe_1234", "Jane Doe", "1234"),
    ("Jane Doe_1234_assignsubmission_file_/my work.ipynb", "Jane_Doe_1234", "Jane Doe", "1234"),
    ("王小明_1235_assignsubmission_file_nb.ipynb", "王小明_1235", "王小明", "1235"),
    ("Zoë  Ørsted_1234_assignsubmission_file_nb.ipynb", "Zoë_Ørsted_1234", "Zoë  Ørsted", "1234"),
    ("doejane_12345_67890_01_tokenization.ipynb", "doejane_12345", "doejane", "12345"),
    ("doejane_late_12345_67890_01_tokenization-1.ipynb", "doejane_12345", "doejane", "12345"),
    ("alice/01_tokenization.ipynb", "alice", "alice", None),
    ("alice/ch_01_02_x.ipynb", "alice", "alice", None),  # in a folder, the folder wins
])
def test_student_is_keyed_by_the_lms_id_in_each_naming_scheme(name, key, display, lms_id):
    student, _ = collect.student_of(name)
    assert (student.key, student.name, student.lms_id) == (key, display, lms_id)


def test_the_naming_schemes_in_collects_help_are_the_ones_it_applies():
    examples = re.findall(r"^  \w[\w ]*?\s{2,}(\S.*?\.ipynb).*?->\s+(\S+)$", collect.NAMING_HELP, re.M)
    assert len(examples) == 4
    for name, key in examples:
        assert collect.student_of(name)[0].key == key, name


def test_names_keep_their_letters_in_every_script():
    assert collect.normalise("Zoe\u0308 Ørsted") == "Zoë_Ørsted"  # NFC: one code point for ë
    assert collect.normalise("  Jean-Luc\tO'Brien  ") == "Jean-Luc_OBrien"
    assert collect.normalise("../..//etc") == "etc"
    assert collect.Student("???", None).key == "unknown"
    assert collect.Student("???", "7").key == "7"
    long = collect.Student("王" * 200, "1" * 100).key  # a folder name holds at most 255 bytes
    assert long.startswith("王王") and long.endswith("_" + "1" * 60) and len(long.encode()) <= 240


def test_unknown_names_match_nothing_without_a_folder():
    assert collect.student_of("final.ipynb") is None
    assert collect.student_of("final.ipynb", pattern=r"(?P<student>x)") is None
    assert collect.student_of("bob-final.ipynb", pattern=r"(?P<student>[a-z]+)-")[0].key == "bob"
    assert collect.student_of("final.ipynb", wrapper="carol")[0].key == "carol"
    assert collect.student_of("bob_42.ipynb", pattern=r"(?P<student>[a-z]+)_(?P<id>\d+)")[0].key == "bob_42"
    with pytest.raises(SystemExit, match="'student' or an 'id' group"):
        collect.student_of("bob-final.ipynb", pattern=r"[a-z]+-")


def test_collect_a_zip_files_notebooks_and_reports_the_rest(tmp_path):
    nb = config.student_path(CHAPTER).read_bytes()
    export = make_zip(tmp_path / "export.zip", [
        ("HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb", b'{"old": 1}', (2026, 12, 1, 0, 0, 0)),
        ("HW1_jdoe_attempt_2026-11-21-09-00-00_nb.ipynb", nb, None),  # later by the LMS: wins
        ("HW1_asmith_attempt_2026-11-20-11-00-00_nb.ipynb", nb, None),
        ("HW1_asmith_attempt_2026-11-20-11-00-00_notes.txt", b"hello", None),
        ("orphan.ipynb", nb, None),
    ])
    grading = tmp_path / "grading"
    proc = subprocess.run([sys.executable, "-m", "course_tools", "collect", CHAPTER, str(export),
                           "--grading-dir", str(grading)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "Collected 2 students." in proc.stdout
    assert "could not match a student to: orphan.ipynb" in proc.stdout
    assert "not a notebook, skipped: HW1_asmith_attempt_2026-11-20-11-00-00_notes.txt" in proc.stdout
    assert ("superseded by a later or identical file: HW1_jdoe_attempt_2026-11-20-10-00-00_nb.ipynb"
            in proc.stdout)
    for student in ("jdoe", "asmith"):
        assert submitted(grading, student).read_bytes() == nb
    assert collect.manifest(CHAPTER, grading)["students"]["jdoe"]["submitted_at"] == "2026-11-21T09:00:00"


def test_collect_a_folder_per_student_and_bad_sources(tmp_path):
    (tmp_path / "in" / "carol").mkdir(parents=True)
    (tmp_path / "in" / "carol" / "whatever.ipynb").write_text("{}")
    report = collect.collect(CHAPTER, tmp_path / "in", tmp_path / "grading")
    assert report.collected == {"carol": "carol/whatever.ipynb"}
    with pytest.raises(SystemExit, match="No such file"):
        collect.collect(CHAPTER, tmp_path / "missing.zip", tmp_path / "grading")
    (tmp_path / "not.zip").write_text("plain text")
    with pytest.raises(SystemExit, match="neither a folder nor a zip"):
        collect.collect(CHAPTER, tmp_path / "not.zip", tmp_path / "grading")
    with pytest.raises(SystemExit, match="Unknown chapter"):
        collect.collect("99_nothing", tmp_path / "in", tmp_path / "grading")
    with pytest.raises(SystemExit, match="not a regular expression"):
        collect.collect(CHAPTER, tmp_path / "in", tmp_path / "grading", pattern="(?P<student>")


def test_moodle_export_gives_one_row_per_student_and_an_exact_manifest(tmp_path):
    moodle = "_assignsubmission_file_"
    export = make_zip(tmp_path / "moodle.zip", [
        (f"Jane Doe_1234{moodle}nb.ipynb", b'{"jane": 1234}', None),
        (f"Jane Doe_5678{moodle}nb.ipynb", b'{"jane": 5678}', (2026, 11, 21, 8, 30, 0)),
        (f"Max Muster_42{moodle}report.pdf", b"%PDF", None),
    ])
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, export, grading)
    assert submitted(grading, "Jane_Doe_1234").read_bytes() == b'{"jane": 1234}'
    assert submitted(grading, "Jane_Doe_5678").read_bytes() == b'{"jane": 5678}'
    assert list((grading / "submitted" / "Max_Muster_42" / CHAPTER).iterdir()) == []
    problem = f"no notebook in the submission (found: Max Muster_42{moodle}report.pdf)"
    assert f"  Max_Muster_42: {problem}" in report.lines()
    assert json.loads((grading / "collected" / f"{CHAPTER}.json").read_text()) == {
        "chapter": CHAPTER,
        "students": {
            "Jane_Doe_1234": {"name": "Jane Doe", "lms_id": "1234",
                              "source": f"Jane Doe_1234{moodle}nb.ipynb",
                              "submitted_at": "2026-11-20T10:00:00", "problem": None},
            "Jane_Doe_5678": {"name": "Jane Doe", "lms_id": "5678",
                              "source": f"Jane Doe_5678{moodle}nb.ipynb",
                              "submitted_at": "2026-11-21T08:30:00", "problem": None},
            "Max_Muster_42": {"name": "Max Muster", "lms_id": "42", "source": None,
                              "submitted_at": None, "problem": problem},
        },
        "unmatched": [],
        "skipped": [{"source": f"Max Muster_42{moodle}report.pdf", "reason": "not a notebook"}],
        "superseded": [],
    }
    assert collect.manifest(CHAPTER, grading) == json.loads(
        (grading / "collected" / f"{CHAPTER}.json").read_text())


def test_a_name_holding_a_slash_keeps_its_lms_id(tmp_path):
    """``<b>Xss</b> =1+1``: the ``/`` cuts the entry into folders; the student keeps the whole name
    and the id, as a flat file and as a Moodle folder, and a Canvas-looking file in an ordinary
    student folder still belongs to the folder."""
    moodle = "_assignsubmission_file_"
    export = make_zip(tmp_path / "moodle.zip", [
        (f"<b>Xss</b> =1+1_1234{moodle}nb.ipynb", b"1", None),
        (f"A/B_77{moodle}/work/nb.ipynb", b"2", None),
        (f"Jane Doe_5678{moodle}nb.ipynb", b"3", None),
        ("alice/hw_1_2_final.ipynb", b"4", None),
    ])
    grading = tmp_path / "grading"
    collect.collect(CHAPTER, export, grading)
    rows = collect.manifest(CHAPTER, grading)["students"]
    assert {k: (row["name"], row["lms_id"]) for k, row in rows.items()} == {
        "bXssb_11_1234": ("<b>Xss</b> =1+1", "1234"), "AB_77": ("A/B", "77"),
        "Jane_Doe_5678": ("Jane Doe", "5678"), "alice": ("alice", None)}
    assert {k: submitted(grading, k).read_bytes() for k in rows} == {
        "bXssb_11_1234": b"1", "AB_77": b"2", "Jane_Doe_5678": b"3", "alice": b"4"}


def test_non_latin_names_stay_readable_and_colliding_folders_stay_apart(tmp_path):
    moodle = "_assignsubmission_file_"
    export = make_zip(tmp_path / "moodle.zip", [
        (f"王小明_1235{moodle}nb.ipynb", b"1", None),
        (f"Zoë Ørsted_1234{moodle}nb.ipynb", b"2", None),
        (f"Zoë  Ørsted_1234{moodle}nb.ipynb", b"3", None),  # another raw name, same folder name
        (f"李雷_77{moodle}nb.ipynb", b"4", None),
    ])
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, export, grading)
    assert sorted(report.collected) == ["Zoë_Ørsted_1234", "Zoë_Ørsted_1234-2", "李雷_77", "王小明_1235"]
    assert {submitted(grading, k).read_bytes() for k in report.collected} == {b"1", b"2", b"3", b"4"}
    assert any("Zoë_Ørsted_1234-2" in line for line in report.lines())
    names = {row["name"] for row in collect.manifest(CHAPTER, grading)["students"].values()}
    assert names == {"王小明", "Zoë Ørsted", "Zoë  Ørsted", "李雷"}


def test_a_name_with_control_characters_gets_a_row_and_a_readable_name(tmp_path):
    moodle = "_assignsubmission_file_nb.ipynb"
    export = make_zip(tmp_path / "e.zip", [
        (f"Jane\nDoe_1001{moodle}", b"1", None),
        (f"Bo\tChen\x1b[31m_1002{moodle}", b"2", None),
        (f"Eve\u202egnp.exe_1003{moodle}", b"3", None),  # a right-to-left override
        ("Kim\r\nLee/nb.ipynb", b"4", None),  # a folder per student
        ("HW1_j\ndoe_attempt_2026-11-20-10-00-00_nb.ipynb", b"5", None),
    ])
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, export, grading)
    assert report.unmatched == [] and report.skipped == []
    rows = collect.manifest(CHAPTER, grading)["students"]
    assert {k: (row["name"], row["lms_id"]) for k, row in rows.items()} == {
        "Jane_Doe_1001": ("Jane Doe", "1001"), "Bo_Chen_31m_1002": ("Bo Chen [31m", "1002"),
        "Eve_gnp.exe_1003": ("Eve gnp.exe", "1003"), "Kim_Lee": ("Kim  Lee", None),
        "j_doe": ("j doe", "j doe")}
    assert {k: submitted(grading, k).read_bytes() for k in rows} == {
        "Jane_Doe_1001": b"1", "Bo_Chen_31m_1002": b"2", "Eve_gnp.exe_1003": b"3", "Kim_Lee": b"4",
        "j_doe": b"5"}


def test_utf8_names_without_the_zip_utf8_flag_are_decoded(tmp_path):
    raw = "王小明_1235_assignsubmission_file_nb.ipynb".encode()

    class WithoutFlag(zipfile.ZipInfo):  # what zippers that ignore the UTF-8 flag write
        def _encodeFilenameFlags(self):
            return raw, 0

    with zipfile.ZipFile(tmp_path / "e.zip", "w") as z:
        z.writestr(WithoutFlag(raw.decode("cp437")), b"{}")
    with zipfile.ZipFile(tmp_path / "e.zip") as z:
        assert z.namelist() != ["王小明_1235_assignsubmission_file_nb.ipynb"]  # zipfile alone misreads it
    assert collect.collect(CHAPTER, tmp_path / "e.zip", tmp_path / "g").collected == {
        "王小明_1235": "王小明_1235_assignsubmission_file_nb.ipynb"}


def test_latest_by_the_lms_date_wins_not_the_last_name_and_case_of_ipynb_does_not_matter(tmp_path):
    moodle = "Jane Doe_1234_assignsubmission_file_"
    export = make_zip(tmp_path / "e.zip", [
        (f"{moodle}nb.IPYNB", b"final", (2026, 11, 21, 12, 0, 0)),
        (f"{moodle}nb_old.ipynb", b"draft", (2026, 11, 20, 9, 0, 0)),  # later by name, older by date
        ("Max Muster_42_assignsubmission_file_HW.IPYNB", b"max", None),
    ])
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, export, grading)
    assert submitted(grading, "Jane_Doe_1234").read_bytes() == b"final"
    assert submitted(grading, "Max_Muster_42").read_bytes() == b"max"
    assert report.superseded == [f"{moodle}nb_old.ipynb"]
    # In a folder the file's mtime decides.
    (tmp_path / "f" / "bob").mkdir(parents=True)
    for name, data, mtime in [("b.ipynb", b"old", 10), ("a.ipynb", b"new", 20)]:
        (tmp_path / "f" / "bob" / name).write_bytes(data)
        os.utime(tmp_path / "f" / "bob" / name, (mtime, mtime))
    collect.collect(CHAPTER, tmp_path / "f", grading)
    assert submitted(grading, "bob").read_bytes() == b"new"


def test_latest_notebooks_of_one_time_that_differ_are_a_problem_not_a_guess(tmp_path):
    board = "HW1_{}_attempt_2026-11-20-10-00-00_{}.ipynb"
    export = make_zip(tmp_path / "e.zip", [
        (board.format("jdoe", "right"), b"right answers", None),
        (board.format("jdoe", "wrong"), b"wrong answers", None),  # same student, same time
        (board.format("ann", "a"), b"same", None),
        (board.format("ann", "b"), b"same", None),  # a copy: nothing to choose
        ("HW1_ann_attempt_2026-11-19-10-00-00_c.ipynb", b"older", None),
        *[(board.format("max", i), bytes([i]), None) for i in range(collect.MAX_TIED + 1)],
    ])
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, export, grading)
    rows = collect.manifest(CHAPTER, grading)["students"]
    assert rows["jdoe"]["problem"] == (
        f"2 notebooks submitted at the same time ({board.format('jdoe', 'right')}, "
        f"{board.format('jdoe', 'wrong')}), they differ: remove all but the one to grade from the "
        "export, then collect again")
    assert rows["jdoe"]["source"] is None and rows["jdoe"]["submitted_at"] == "2026-11-20T10:00:00"
    assert list(submitted(grading, "jdoe").parent.iterdir()) == []  # nothing graded by a guess
    assert f"  jdoe: {rows['jdoe']['problem']}" in report.lines()
    assert submitted(grading, "ann").read_bytes() == b"same" and rows["ann"]["problem"] is None
    assert sorted(report.superseded) == ["HW1_ann_attempt_2026-11-19-10-00-00_c.ipynb",
                                         board.format("ann", "a")]
    assert rows["max"]["problem"].startswith(f"{collect.MAX_TIED + 1} notebooks submitted at the same")
    assert f"and 6 more), more than {collect.MAX_TIED}: remove" in rows["max"]["problem"]


def test_file_names_that_are_not_utf8_are_collected_and_written(tmp_path):
    """Names in Latin-1 (``café`` with the byte 0xE9) reach Python as lone surrogates, which no
    UTF-8 file takes: each student gets a row, the manifest is written and the report printed."""
    source = os.fsencode(tmp_path / "in")
    for folder, name, data in [(b"caf\xe9_1234_assignsubmission_file_", b"nb.ipynb", b"{}"),
                               (b"bob", b"notes \xff.txt", b"x")]:
        os.makedirs(source + b"/" + folder)
        with open(source + b"/" + folder + b"/" + name, "wb") as f:
            f.write(data)
    grading = tmp_path / "grading"
    report = collect.collect(CHAPTER, tmp_path / "in", grading)
    rows = collect.manifest(CHAPTER, grading)["students"]
    assert {k: (row["name"], row["lms_id"]) for k, row in rows.items()} == {
        "caf_1234": ("caf\ufffd", "1234"), "bob": ("bob", None)}
    assert "  bob: no notebook in the submission (found: notes \ufffd.txt)" in report.lines()
    assert submitted(grading, "caf_1234").read_text() == "{}"


def test_folder_export_never_reads_links_fifos_or_sockets(tmp_path):
    secret = tmp_path / "secret.key"
    secret.write_bytes(SECRET)
    os.chmod(secret, 0o600)
    os.utime(secret, (1_000_000, 1_000_000))
    before = os.stat(secret)
    export = tmp_path / "export"
    for student in ("alice", "bob", "carol", "dave", "erin"):
        (export / student).mkdir(parents=True)
    (export / "alice" / "nb.ipynb").symlink_to(secret)
    (export / "alice" / "real.ipynb").write_bytes(b"alice")
    os.link(secret, export / "bob" / "nb.ipynb")  # a hard link: same file as the secret
    os.mkfifo(export / "carol" / "nb.ipynb")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(export / "dave" / "nb.ipynb"))
    (export / "erin" / "link").symlink_to(tmp_path, target_is_directory=True)
    (export / "erin" / "nb.ipynb").write_bytes(b"erin")

    def hung(*_):
        raise TimeoutError("collect blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        report = collect.collect(CHAPTER, export, tmp_path / "grading")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert report.collected == {"alice": "alice/real.ipynb", "erin": "erin/nb.ipynb"}
    for student in ("bob", "carol", "dave"):
        assert report.students[student]["problem"] == (
            "no notebook in the submission (found: nb.ipynb (not a regular file))")
        assert list((tmp_path / "grading" / "submitted" / student / CHAPTER).iterdir()) == []
    for rel in ("alice/nb.ipynb", "bob/nb.ipynb", "carol/nb.ipynb", "dave/nb.ipynb", "erin/link"):
        assert f"  not a regular file, skipped: {rel}" in report.lines()
    assert all(SECRET not in p.read_bytes() for p in every_file(tmp_path / "grading"))
    after = os.stat(secret)
    unchanged = ("st_mode", "st_mtime", "st_atime", "st_size")
    assert [getattr(after, a) for a in unchanged] == [getattr(before, a) for a in unchanged]


def test_zip_symlinks_and_escaping_names_are_refused(tmp_path):
    link = zipfile.ZipInfo("Jane Doe_1234_assignsubmission_file_nb.ipynb")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    export = tmp_path / "e.zip"
    with zipfile.ZipFile(export, "w") as z:
        z.writestr(link, str(tmp_path / "secret.key"))
        for name in ("../evil.ipynb", "/abs.ipynb", "a/../../evil2.ipynb", "C:\\evil3.ipynb"):
            z.writestr(name, b"{}")
    grading = tmp_path / "deep" / "grading"
    report = collect.collect(CHAPTER, export, grading)
    assert report.collected == {}
    assert report.students["Jane_Doe_1234"]["problem"].endswith("(not a regular file))")
    skipped = dict(report.skipped)
    assert skipped["Jane Doe_1234_assignsubmission_file_nb.ipynb"] == "not a regular file"
    escaping = ("../evil.ipynb", "/abs.ipynb", "a/../../evil2.ipynb", "C:\\evil3.ipynb")
    assert [skipped[n] for n in escaping] == ["unsafe path in the zip"] * 4
    assert not list(tmp_path.rglob("evil*")) and not (tmp_path / "deep" / "evil.ipynb").exists()


def test_a_notebook_over_the_size_limit_is_refused_without_trusting_its_header(tmp_path):
    big = b"{" + b" " * (25 * 2**20) + b"}"
    export = make_zip(tmp_path / "e.zip", [("bob/nb.ipynb", big, None), ("amy/nb.ipynb", b"{}", None)])
    grading = tmp_path / "grading"
    submitted(grading, "bob").parent.mkdir(parents=True)
    submitted(grading, "bob").write_bytes(b"from an earlier collect")
    report = collect.collect(CHAPTER, export, grading)
    assert report.collected == {"amy": "amy/nb.ipynb"}
    assert report.students["bob"]["problem"] == "the notebook is larger than 20 MB"
    assert not submitted(grading, "bob").exists()  # the stale copy is gone, not graded by mistake


def test_writes_never_go_through_a_symlink_planted_in_the_grading_folder(tmp_path):
    outside = tmp_path / "gradebook.db"
    outside.write_bytes(b"gradebook")
    (tmp_path / "elsewhere").mkdir()
    grading = tmp_path / "grading"
    submitted(grading, "amy").parent.mkdir(parents=True)
    submitted(grading, "amy").symlink_to(outside)  # planted by an earlier, hostile submission
    (submitted(grading, "amy").parent / "timestamp.txt").write_text("stale")
    (grading / "submitted" / "bob").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (grading / "submitted" / "cid").mkdir()
    (grading / "submitted" / "cid" / CHAPTER).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    export = make_zip(tmp_path / "e.zip", [("amy/nb.ipynb", b"amy", None), ("bob/nb.ipynb", b"bob", None),
                                            ("cid/nb.ipynb", b"cid", None)])
    report = collect.collect(CHAPTER, export, grading)
    assert outside.read_bytes() == b"gradebook"
    assert [p.name for p in submitted(grading, "amy").parent.iterdir()] == [f"{CHAPTER}.ipynb"]  # fresh
    assert not submitted(grading, "amy").is_symlink() and submitted(grading, "amy").read_bytes() == b"amy"
    assert not submitted(grading, "cid").parent.is_symlink()
    assert submitted(grading, "cid").read_bytes() == b"cid"
    assert "symbolic link" in report.students["bob"]["problem"]
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_wrapping_folder_is_not_a_student_and_folders_are_not_merged(tmp_path):
    export = make_zip(tmp_path / "e.zip", [
        ("export/amy/hw_1_2_final.ipynb", b"amy", None),  # a Canvas-looking name inside a folder
        ("export/bob/hw_1_2_final.ipynb", b"bob", None),
        ("export/.DS_Store", b"", None),
        ("__MACOSX/export/._x", b"", None),
    ])
    report = collect.collect(CHAPTER, export, tmp_path / "grading")
    assert report.collected == {"amy": "export/amy/hw_1_2_final.ipynb",
                                "bob": "export/bob/hw_1_2_final.ipynb"}
    assert ("export/.DS_Store", "hidden or macOS metadata file") in report.skipped


def test_a_second_export_keeps_the_students_of_the_first(tmp_path):
    grading = tmp_path / "grading"
    assert collect.manifest(CHAPTER, grading) == {
        "chapter": CHAPTER, "students": {}, "unmatched": [], "skipped": [], "superseded": []}
    collect.collect(CHAPTER, make_zip(tmp_path / "a.zip", [("amy/nb.ipynb", b"a1", None),
                                                          ("bob/nb.ipynb", b"b1", None)]), grading)
    collect.collect(CHAPTER, make_zip(tmp_path / "b.zip", [("bob/late.ipynb", b"b2", None),
                                                          ("cid/nb.ipynb", b"c1", None)]), grading)
    students = collect.manifest(CHAPTER, grading)["students"]
    assert {k: row["source"] for k, row in students.items()} == {
        "amy": "amy/nb.ipynb", "bob": "bob/late.ipynb", "cid": "cid/nb.ipynb"}
    assert submitted(grading, "bob").read_bytes() == b"b2"
    # Another student whose name gives a folder already held from the first export is kept apart.
    report = collect.collect(CHAPTER, make_zip(tmp_path / "c.zip", [("amy?/nb.ipynb", b"a2", None)]), grading)
    assert report.collected == {"amy-2": "amy?/nb.ipynb"}
    assert submitted(grading, "amy").read_bytes() == b"a1"
