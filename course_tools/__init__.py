"""The course's tooling, apart from the reference library (``course_lib``, which never imports it).

One folder per role:

- ``book/``: what the maintainers' build needs: run the solution notebooks, record the numbers the
  text quotes, build the HTML book, release the student notebooks.
- ``student/``: what a student's notebook and self-check need at run time: the checks the test
  cells call, glue, the self-check, the Lab kernel. Small, and importable without nbgrader (Colab).
- ``grading/``: the instructors' autograding, split at the trust boundary:
  ``grading/sandboxed/`` runs inside the sandbox beside student code (the worker, the graded run,
  the wire encoder, the guard); ``grading/grader/`` runs in the grader's own process, where
  verdicts are decided (collect, the answer key, the judge, grades, feedback).
- ``catalogues/``: each chapter's wrong and correct answers written differently, and the mutation
  testing that grades the graders with them.

``config`` and ``notebook`` (the layout of a chapter's notebook) are shared by every role.
Command line: ``python -m course_tools --help``.
"""

import sys as _sys

# nbformat validates notebooks with jsonschema, which compiles a grammar for IRI strings when
# rfc3987-syntax is installed (jupyter-events pulls it in): 1.2 s at every import, for a string
# format no notebook schema uses. Without it jsonschema skips that format, so every tool here
# (self-check, grading, release) starts faster.
_sys.modules.setdefault("rfc3987_syntax", None)
