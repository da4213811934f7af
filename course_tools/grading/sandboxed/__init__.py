"""Inside the sandbox, beside student code: nothing here decides a verdict or holds an expected value.

``worker`` runs a submission's notebook; ``graded_run`` runs each exercise's tests on the answer
and records what the answer gave; ``wire`` encodes those records as plain data; ``guard`` reports
introspection; ``harden`` and ``work_limit`` keep the runner and its limits out of an answer's reach.
"""
