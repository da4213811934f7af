"""``python -m course_lib.moe runs``: train the chapter 07 runs (see :mod:`course_lib.moe.runs`)."""

from .runs import main

raise SystemExit(main())
