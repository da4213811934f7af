"""The kernel ``make lab`` gives the student notebooks: IPython's, minus the Python version in
the language information it reports.

JupyterLab writes the kernel's ``kernelspec`` and ``language_info`` into a notebook's metadata
as soon as the kernel starts, and marks the notebook modified when they differ from what the
file holds: every student would see an untouched notebook as changed, because the released
notebooks cannot know the patch version of each student's Python. The release writes the rest
of the metadata exactly as this kernel reports it (``config.STUDENT_METADATA``).
"""

from __future__ import annotations

from ipykernel.ipkernel import IPythonKernel

from course_tools.config import STUDENT_METADATA


class StudentKernel(IPythonKernel):
    language_info = STUDENT_METADATA["language_info"]
