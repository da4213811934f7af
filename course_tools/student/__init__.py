"""What a student's notebook and self-check need at run time: ``checks`` (what test cells call),
``judges`` (the rules a check applies, the same in the notebook, the self-check and the grader),
``glue`` (numbers handed to the text), the self-check, and the Lab kernel. Imports no nbgrader, so
that a notebook works in Colab.
"""
