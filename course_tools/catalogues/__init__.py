"""Each chapter's catalogues, ``mutants/`` (plausible wrong answers), ``acceptance/`` (correct answers
written differently) and ``unseen_mistakes/`` (a held-out set), and the tools that grade the
graders with them (``mutants``) and measure how well mistakes are named (``naming``).
"""
