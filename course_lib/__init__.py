"""Reference library of the course "Transformers and LLMs from scratch".

One module per idea, in chapter order: ``bpe`` and ``patches`` (01). Notebooks import modules,
not names (``from course_lib import bpe``), so a reference never shadows a student's function.
The course tooling (release, book, grading, self-check) lives in ``course_lib.grading`` and is
never imported by the algorithm modules.
"""

__version__ = "0.1.0"
