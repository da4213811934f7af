"""`make lab` starts JupyterLab on the student notebooks.

The target runs here as a student would run it, with ``LAB_ARGS`` adding what a test needs (no
browser, a free port, a known token); the server must serve the JupyterLab page, list every
chapter's student notebook and open it as a notebook.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course_tools import config, notebook
from tests.conftest import CHAPTERS, ROOT, skip_or_fail

TOKEN = "course-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"{url}{'&' if '?' in url else '?'}token={TOKEN}", timeout=10) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not (Path(sys.prefix) / ".installed").is_file():
        skip_or_fail("`make lab` needs the environment `make install` builds; this Python is not it")
    port = _free_port()
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    log = tmp_path_factory.mktemp("lab") / "log.txt"
    with open(log, "wb") as out:
        server = subprocess.Popen(["make", "-s", "lab", f"VENV={sys.prefix}", f"LAB_ARGS={args}"], cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # JupyterLab takes a few seconds to start
            if server.poll() is not None:
                pytest.fail(f"`make lab` exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                _get(f"{url}/api/status")
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer within 60 s")
        yield url
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="make and process groups: a POSIX test")
def test_make_lab_serves_jupyterlab_on_every_student_notebook(lab):
    status, page = _get(f"{lab}/lab")
    assert status == 200 and b"JupyterLab" in page
    _, listing = _get(f"{lab}/api/contents")
    assert {item["name"] for item in json.loads(listing)["content"]} >= set(CHAPTERS)
    for chapter in CHAPTERS:
        relative = config.student_path(chapter).relative_to(ROOT / "notebooks").as_posix()
        _, body = _get(f"{lab}/api/contents/{relative}?type=notebook&content=1")
        opened = json.loads(body)
        assert opened["type"] == "notebook", chapter
        served = [cell["source"] for cell in opened["content"]["cells"]]
        assert served == [cell.source for cell in notebook.read(config.student_path(chapter)).cells], chapter


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="make and process groups: a POSIX test")
def test_make_lab_hides_the_instructor_panels_of_nbgrader(lab):
    _, page = _get(f"{lab}/lab")
    found = re.search(rb'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
    assert found, "no page config in JupyterLab's page"
    page_config = json.loads(found.group(1))
    disabled = page_config["disabledExtensions"]  # a list, or a dict of names to true
    assert "@jupyter/nbgrader" in disabled and disabled != {"@jupyter/nbgrader": False}
    loaded = {ext["name"] for ext in page_config["federated_extensions"]}
    assert "@jupyter/nbgrader" in loaded  # installed (make formgrader uses it), switched off for students
