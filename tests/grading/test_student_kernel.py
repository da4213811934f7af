"""Opening an untouched student notebook in ``make lab`` does not mark it modified: JupyterLab
writes the kernel's kernelspec and language_info into the notebook when the kernel starts, so the
released metadata must be exactly what the students' kernel reports (checked in a browser once:
with any other metadata, JupyterLab saved the notebook seconds after it opened)."""

from __future__ import annotations

import json

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from course_tools import config, notebook
from tests.conftest import CHAPTERS, ROOT

STUDENT_LAB = ROOT / "course_tools" / "student" / "lab"


def test_the_students_kernel_reports_the_released_metadata(monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(STUDENT_LAB))  # as make lab sets it
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.resource_dir.startswith(str(STUDENT_LAB))
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.kernel_info(reply=True, timeout=60)["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["language_info"] == config.STUDENT_METADATA["language_info"]
    kernelspec = {"display_name": spec.display_name, "language": spec.language, "name": "python3"}
    assert kernelspec == config.STUDENT_METADATA["kernelspec"]
    assert json.loads(
        (STUDENT_LAB / "kernels" / "python3" / "kernel.json").read_text())["argv"][0] == "python"


def test_every_released_notebook_carries_that_metadata():
    for chapter in CHAPTERS:
        nb = notebook.read(config.student_path(chapter))
        assert dict(nb.metadata) == config.STUDENT_METADATA, chapter
