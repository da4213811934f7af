"""Course tooling: releasing student notebooks, building the book, self-checks and autograding.

A separate small layer on top of nbgrader, nbclient and Jupyter Book; the algorithm modules of
course_lib never import it. Command line: ``python -m course_lib.grading --help``.
"""

import sys as _sys

# nbformat validates notebooks with jsonschema, which compiles a grammar for IRI strings when
# rfc3987-syntax is installed (jupyter-events pulls it in): 1.2 s at every import, for a string
# format no notebook schema uses. Without it jsonschema skips that format, so every tool here
# (self-check, grading, release) starts faster.
_sys.modules.setdefault("rfc3987_syntax", None)
