"""Naming a failing answer by the known mistakes (course_tools.grading.grader.mistakes), on hand-made keys
and records: the same wrong values name a mistake, anything the key can tell apart does not, and
a correct answer is never named. The catalogues themselves are measured in test_catalogues.py."""

from __future__ import annotations

import json

import pytest
import torch

from course_tools.grading.grader import mistakes, verdicts
from course_tools.grading.sandboxed import graded_run, wire
from course_tools.student import checks

X = torch.linspace(-1, 1, 12).reshape(3, 4)  # the inputs of the hand-made exercise
RIGHT = X.softmax(-1)


def _session(recording: bool, answer, error: str | None = None) -> dict:
    """The record (or, ``recording=False``, the key) of a two-check exercise on ``answer``'s output:
    its shape, then its values against the softmax over the last axis."""
    session = checks._session = graded_run.Session(recording=recording)
    try:
        if answer is not None:
            checks.assert_equal(tuple(answer.shape), (3, 4) if not recording else None, "the shape")
            checks.assert_close(answer, None if recording else RIGHT.double(), "softmax(x)")
    finally:
        checks._session = None
    return session.entries if not recording else {"checks": session.entries, "error": error}


KEY = _session(False, RIGHT)


def _known(*answers) -> list[dict]:
    """Known mistakes, as a key keeps them, from wrong answers (or (answer, error) pairs)."""
    out = []
    for i, answer in enumerate(answers):
        answer, error = answer if isinstance(answer, tuple) else (answer, None)
        record = _session(True, answer, error)
        assert verdicts.judge(KEY, record) is not None, "a known mistake must fail"
        kept = mistakes._failures_only(KEY, record)
        out.append({"why": f"mistake {i}", "hint": f"look at {i}", "record": kept})
    return out


def _name(known, answer, error=None) -> str | None:
    found = mistakes.name(KEY, known, _session(True, answer, error))
    return found and found["why"]


def test_an_answer_with_a_known_mistakes_values_is_named_and_others_are_not():
    known = _known(X.softmax(0), X.softmax(-1) * 2)
    assert _name(known, X.softmax(0)) == "mistake 0"
    assert _name(known, X.T.softmax(-1).T) == "mistake 0"  # the same mistake written otherwise
    assert _name(known, X.softmax(-1) * 2) == "mistake 1"
    assert _name(known, X.softmax(-1) * 3) is None  # wrong, but like no known mistake
    assert _name(known, X.softmax(0) + 1e-3) is None  # beyond the check's tolerance of the mistake


def test_values_within_the_checks_tolerance_of_the_mistakes_are_the_same_mistake():
    known = _known(X.softmax(0))
    close = (X.double().softmax(0) * (1 + 1e-7)).float()
    assert _name(known, close) == "mistake 0"


def test_a_correct_answer_is_never_named():
    known = _known(X.softmax(0), X.softmax(-1) * 2)
    for right in (RIGHT, X.double().softmax(-1), torch.exp(X) / torch.exp(X).sum(-1, keepdim=True)):
        assert _name(known, right) is None


def test_a_check_one_passes_and_the_other_fails_tells_them_apart():
    known = _known(X.softmax(0).reshape(4, 3))  # fails the shape, so the values too
    assert _name(known, X.softmax(0).reshape(4, 3)) == "mistake 0"
    assert _name(known, X.softmax(-1).reshape(4, 3)) is None  # same wrong shape, other values
    assert _name(known, X.softmax(0)) is None  # right shape


def test_errors_are_the_same_mistake_wherever_in_the_answer_they_are_raised():
    known = _known((None, "IndexError: Dimension out of range (raised at line 3 of the answer)"))
    elsewhere = "IndexError: Dimension out of range (raised at line 7 of the answer)"
    assert _name(known, None, elsewhere) == "mistake 0"
    assert _name(known, None, "IndexError: index 4 is out of bounds") is None
    assert _name(known, None, "no result came back from the tests: it ran past its limit") is None


def test_an_error_that_sends_the_tests_elsewhere_is_the_same_mistake_when_it_does_so_the_same_way():
    shape = _session(True, X.softmax(0))["checks"][0]

    def record(error, kind="true"):
        return {"checks": [shape, {"kind": kind, "what": "ok", "actual": True}], "error": error}

    error = "ValueError: positions must lie in 0 .. 11 (raised at line 8 of the answer)"
    known = [{"why": "off by one", "hint": "h", "record": mistakes._failures_only(KEY, record(error))}]
    assert mistakes.name(KEY, known, record(error.replace("line 8", "line 2")))["why"] == "off by one"
    assert mistakes.name(KEY, known, record("ValueError: another message")) is None
    assert mistakes.name(KEY, known, record(error, kind="unchanged")) is None  # elsewhere, another way
    assert mistakes.name(KEY, known, record(None)) is None  # another path with no error: another test


def test_a_mistake_whose_tests_stop_before_any_check_is_not_kept():
    entries = [{"grade_id": "ex_a", "why": "raises", "hint": "h"},
               {"grade_id": "ex_a", "why": "wrong", "hint": "h"}]
    records = [{"checks": [], "error": "ValueError: the profile has no minimum"},
               _session(True, X.softmax(0))]
    assert [m["why"] for m in mistakes._known({"ex_a": KEY}, entries, records)["ex_a"]] == ["wrong"]


def test_a_run_stopped_by_a_limit_is_never_named():
    stopped = "no result came back from the tests: it ran past its limit of 60 CPU seconds"
    assert _name(_known((None, stopped)), None, stopped) is None


def test_a_run_the_guard_reported_is_never_named_nor_kept():
    known = _known(X.softmax(0))
    flagged = _session(True, X.softmax(0)) | {"events": ["signal.signal in <answer>"]}
    assert mistakes.name(KEY, known, _session(True, X.softmax(0))) is not None
    assert mistakes.name(KEY, known, flagged) is None  # the same values, from a run with a trick
    entries = [{"grade_id": "ex_a", "why": "flagged", "hint": "h"}]
    assert mistakes._known({"ex_a": KEY}, entries, [flagged])["ex_a"] == []


def test_an_answers_record_cannot_claim_that_a_check_passed():
    known = _known(X.softmax(-1) * 2)
    forged = _session(True, X.softmax(-1) * 5)
    forged["checks"][1] = dict(forged["checks"][1], passes=True)
    assert mistakes.name(KEY, known, forged) is None
    tensor = wire.encode(torch.ones(3))
    for broken in ({"checks": "no"}, {"checks": [{"kind": "equal"}], "error": None}, None, {"checks": [1, 2]},
                   {"checks": [{"kind": "equal", "actual": {"tensor": "bogus"}}] * 2, "error": None},
                   {"checks": [{"kind": "equal", "actual": tensor}] * 2, "error": ["not", "text"]},
                   {"checks": [{"kind": "equal", "actual": tensor}, {"kind": "close", "actual": tensor}],
                    "error": None, "what": tensor}):
        assert mistakes.name(KEY, known, broken) is None


def test_the_closest_of_several_matching_mistakes_is_named_then_the_first():
    wrong = X.softmax(0)
    close = (wrong.double() * (1 + 1e-7)).float()
    assert not torch.equal(close, wrong)
    assert _name(_known(close, wrong), wrong) == "mistake 1"  # identical beats within tolerance
    assert _name(_known(wrong, wrong.clone()), wrong) == "mistake 0"


def test_large_values_are_kept_as_a_sample_that_still_tells_mistakes_apart():
    big = torch.linspace(0, 1, 10_000)
    value = mistakes._sampled({"out": [big, 3]})
    assert value["out"][0]["sampled"] == [10_000] and value["out"][0]["values"].numel() == mistakes.SAMPLE
    assert value["out"][1] == 3 and mistakes._sampled(value) == value
    other = big.clone()
    other[-1] += 1  # the last element is always in the sample
    assert mistakes._alike(value, mistakes._sampled({"out": [big.clone(), 3]}), torch.float32, 1)
    assert not mistakes._alike(value, mistakes._sampled({"out": [other, 3]}), torch.float32, 1)
    reshaped = mistakes._sampled({"out": [big.reshape(100, 100), 3]})
    assert not mistakes._alike(value, reshaped, torch.float32, 1)
    key = [{"kind": "close", "what": "x", "expected": wire.encode(big + 1), "params": {}}]
    wrong = {"checks": [{"kind": "close", "what": "x", "actual": wire.encode(big)}], "error": None}
    kept = mistakes._failures_only(key, wrong)
    assert len(json.dumps(kept)) < len(json.dumps(wrong)) / 20


def test_where_the_exercise_states_the_type_another_type_is_another_mistake():

    mask = torch.ones(3, 3).tril()  # 0/1 floats where bools are asked for

    def record(value, recording=True):
        session = checks._session = graded_run.Session(recording=recording)
        try:
            checks.assert_equal(value, None if recording else mask.bool(), "the mask", dtype=torch.bool)
        finally:
            checks._session = None
        return session.entries if not recording else {"checks": session.entries, "error": None}

    key = record(mask.bool(), recording=False)
    known = [{"why": "floats", "hint": "h", "record": mistakes._failures_only(key, record(mask))}]
    assert mistakes.name(key, known, record(mask.clone()))["why"] == "floats"
    assert mistakes.name(key, known, record(mask.numpy().astype(bool))) is None
    assert mistakes.name(key, known, record(mask.long())) is None


def test_a_known_mistake_keeps_only_its_wrong_values():
    (kept,) = _known(X.softmax(0))
    assert kept["record"]["checks"][0] == {"kind": "equal", "passes": True}
    assert "actual" in kept["record"]["checks"][1]


@pytest.mark.parametrize("kind, a, b, same", [
    ("raises", {"classes": ["builtins.TypeError"]}, {"classes": ["builtins.TypeError"], "text": "x"}, True),
    ("raises", {"classes": ["builtins.TypeError"]}, None, False),
    ("unchanged", ["argument 1"], ["argument 2"], True),
    ("unchanged", ["argument 1"], [], False),
    ("forbidden", ["torch.softmax"], ["Tensor.softmax"], True),
    ("device", {"mixed": ["torch.ops.aten.mm"], "error": None, "meta": [], "cpu": []},
     {"mixed": ["torch.ops.aten.add"], "error": None, "meta": [], "cpu": []}, True),
    ("device", {"mixed": [], "error": None, "meta": [["cpu", [2], "float32"]], "cpu": [["cpu", [2], "f32"]]},
     {"mixed": ["torch.ops.aten.add"], "error": None, "meta": [], "cpu": []}, False),
])
def test_observations_are_the_same_mistake_when_they_observed_the_same(kind, a, b, same):
    assert (mistakes._same_failure(kind, {}, (a, "w"), (b, "w")) is not None) == same


def test_a_failed_assert_is_the_same_mistake_only_with_the_same_message():
    assert mistakes._same_failure("true", {}, (False, "rows sum to 2.0"), (False, "rows sum to 2.0"))
    assert mistakes._same_failure("true", {}, (False, "rows sum to 2.0"), (False, "rows sum to 3.0")) is None


def test_the_hint_line():
    assert mistakes.hint_line({"why": "w", "hint": "Check the axis."}) == \
        "This looks like a known mistake: Check the axis."
    assert mistakes.hint_line(None) == "" and mistakes.hint_line({"why": "w", "hint": ""}) == ""
