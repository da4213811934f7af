"""Course tooling: releasing student notebooks, building the book, self-checks and autograding.

A separate small layer on top of nbgrader, nbclient and Jupyter Book; the algorithm modules of
course_lib never import it. Command line: ``python -m course_lib.grading --help``.
"""
