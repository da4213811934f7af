"""Autograding, split at the trust boundary: ``sandboxed/`` runs inside the sandbox, beside student
code; ``grader/`` runs in the grader's own process and decides the verdicts from data alone.
"""
