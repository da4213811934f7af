"""Verdicts from data: the wire format, the two sides of a test cell, the judge, and graded runs
whose answers try to reach the references or forge their record."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest
import torch

from course_tools.grading.grader import unwire, verdicts
from course_tools.grading.sandboxed import graded_run, wire
from course_tools.student import checks, judges

# --- wire ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    None, True, 3, -(2**70), 1.5, float("inf"), "text", [1, [2, "a"]], (1, (2.5,)), {"a": 1, (1, 2): [3]},
    torch.Size([2, 3]), torch.float32, np.float32(1.25), np.arange(6, dtype=np.int32).reshape(2, 3),
])
def test_plain_values_come_back_as_they_were(value):
    back = unwire.decode(json.loads(json.dumps(wire.encode(value))))
    assert type(back) is type(value)
    if isinstance(value, np.ndarray):
        assert np.array_equal(back, value) and back.dtype == value.dtype
    else:
        assert back == value


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_keep_values_dtype_shape_and_requires_grad_whatever_their_strides(dtype):
    base = torch.randn(4, 6, generator=checks.rng(0)).to(dtype)
    for t in (base, base.T, base[:, 1], base[1:2, 3], base[0, 0], base[:0]):
        back = unwire.decode(wire.encode(t))
        assert type(back) is torch.Tensor and back.dtype == t.dtype and back.shape == t.shape
        assert torch.equal(back, t)
    grad = unwire.decode(wire.encode(torch.ones(2, requires_grad=True)))
    assert grad.requires_grad and grad.is_leaf


def test_a_tensor_subclass_comes_back_as_a_plain_tensor_and_compares_honestly():
    class Agreeable(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return torch.tensor(True) if func in (torch.equal, torch.Tensor.__eq__) else \
                super().__torch_function__(func, types, args, kwargs or {})

    forged = torch.zeros(3).as_subclass(Agreeable)
    back = unwire.decode(wire.encode(forged))
    assert type(back) is torch.Tensor
    with pytest.raises(AssertionError, match="expected 1"):
        judges._judge_close(back, torch.ones(3), "x")


def test_what_cannot_travel_is_named_and_fails_its_check():
    for value in (torch.nn.Linear(2, 2), lambda: 1, (i for i in range(3))):
        back = unwire.decode(wire.encode(value))
        assert isinstance(back, wire.Unencodable)
        with pytest.raises(AssertionError):
            judges._judge_close(back, torch.zeros(2), "x")


@pytest.mark.parametrize("data", [
    {"tensor": "float32", "shape": [3], "grad": False, "data": base64.b64encode(b"\0" * 8).decode()},  # short
    {"tensor": "object", "shape": [1], "grad": False, "data": ""},
    {"tensor": "float32", "shape": [-1], "grad": False, "data": ""},
    {"tensor": "float32", "shape": [1], "grad": False, "data": "!!!"},
    {"tensor": "float32", "shape": [0], "grad": False, "data": "", "extra": 1},
    {"pickle": "gASVAAAAAAAAAAA="}, {"float": "1e5"}, {"int": "12a"}, {"dict": [[1]]}, {}, 2**60,
    {"ndarray": "object", "shape": [], "scalar": True, "data": ""},
])
def test_anything_malformed_is_refused(data):
    with pytest.raises(unwire.WireError):
        unwire.decode(data)


def test_deep_nesting_is_refused():
    deep = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(unwire.WireError):
        unwire.decode(deep)

# --- the two sides of a test cell ----------------------------------------------------------------


def test_the_graded_run_never_computes_a_reference_and_the_key_always_does():
    tests = ("out = f(x)\nchecks.assert_close(out, ref(x), 'f(x)')\n"
             "checks.assert_grads_close(f, reference=ref, inputs=[x], what='grad')\n"
             "assert out.sum() > 0, 'sum'")
    answer = verdicts.answer_side(tests)
    assert "ref(" not in answer and "ref," not in answer and "reference=None" in answer
    assert "assert_true(out.sum() > 0, lambda: 'sum')" in answer and "\nassert " not in answer
    assert answer.startswith(f"def {verdicts.TEST_FUNCTION}():")  # the tests' names are locals
    key = verdicts.key_side(tests)
    assert "_reference(lambda: ref(x))" in key and "_reference(lambda: ref)" in key


def test_the_graded_run_holds_no_helper_that_only_the_references_used():
    tests = ("def _ref(x):\n    return _base(x) + 1\ndef _base(x):\n    return x\n"
             "def _check(x):\n    checks.assert_close(f(x), _ref(x), 'f(x)')\n_check(1)")
    answer = verdicts.answer_side(tests)
    assert "_ref" not in answer and "_base" not in answer and "def _check(x)" in answer
    assert "def _ref(x)" in verdicts.key_side(tests)


def test_test_cells_that_reach_out_of_their_function_are_refused():
    with pytest.raises(ValueError, match="global"):
        verdicts.answer_side("global y\ny = 1")


# --- the judge --------------------------------------------------------------------------------------


def _key_and_record(answer: str, tests: str) -> tuple[list, dict]:
    """Key from a reference answer ``f = abs``-style, record of ``answer``, both in this process."""
    results = {}
    for side, code in (("key", "def f(x):\n    return x.abs()\n"), ("record", answer)):
        session = checks._session = graded_run.Session(recording=side == "record")
        ns = {"torch": torch, "checks": checks, graded_run.CHECKS_NAME: checks}
        error = None
        try:
            exec(code, ns)
            exec(verdicts.answer_side(tests) if side == "record" else verdicts.key_side(tests), ns)
        except Exception as e:  # noqa: BLE001
            error = f"{type(e).__name__}: {e}"
        finally:
            checks._session = None
        results[side] = {"checks": json.loads(json.dumps(session.entries)), "error": error}
    return results["key"]["checks"], results["record"]


TESTS = ("x = torch.tensor([-1.0, 2.0])\nchecks.assert_close(f(x), x.abs(), 'f(x)')\n"
         "checks.assert_equal(f(x).shape, (2,), 'shape')\nassert f(x).sum() > 0, f'sum of {f(x)}'")


def test_a_correct_record_passes_and_a_wrong_one_fails_with_the_keys_words():
    key, good = _key_and_record("def f(x):\n    return torch.where(x < 0, -x, x)\n", TESTS)
    assert len(key) == 3 and verdicts.judge(key, good) is None
    _, bad = _key_and_record("def f(x):\n    return x\n", TESTS)
    assert "f(x): expected 1" in verdicts.judge(key, bad)


@pytest.mark.parametrize("forge", [
    lambda r: {"checks": r["checks"][:1], "error": None},                      # shorter
    lambda r: {"checks": r["checks"] + r["checks"][:1], "error": None},        # longer
    lambda r: {"checks": r["checks"], "error": "RuntimeError: late"},          # stopped
    lambda r: {"checks": [dict(c, kind="true") for c in r["checks"]], "error": None},  # another path
    lambda r: {"checks": [dict(c, actual={"pickle": "x"}) for c in r["checks"]], "error": None},
    lambda r: None, lambda r: {"checks": "all passed"}, lambda r: {"checks": [], "error": 3},
])
def test_a_missing_late_malformed_or_reordered_record_fails(forge):
    key, good = _key_and_record("def f(x):\n    return x.abs()\n", TESTS)
    assert verdicts.judge(key, forge(good)) is not None


def test_an_error_raised_inside_a_checks_block_is_said_with_its_line():
    """A block that records at its end (checks.forbidding) records before the error propagates:
    the record takes another path than the key's, and the verdict says the error, not the path."""
    tests = "x = torch.tensor([-1.0, 2.0])\nwith checks.forbidding([torch.sort], 'no sort'):\n" \
            "    checks.assert_close(f(x), x.abs(), 'f(x)')"
    key, record = _key_and_record("def f(x):\n    return x.abs()\n", tests)
    _, broken = _key_and_record("def f(x):\n    return x.nope()\n", tests)
    assert verdicts.judge(key, record) is None
    assert verdicts.judge(key, broken) == \
        "the tests stopped: AttributeError: 'Tensor' object has no attribute 'nope'"


def test_a_failed_observation_is_reported_in_the_graded_runs_words():
    key, record = _key_and_record("def f(x):\n    return -x.abs()\n",
                                  "x = torch.tensor([-1.0, 2.0])\n"
                                  "assert f(x).sum() > 0, f'sum of {f(x).tolist()}'")
    assert verdicts.judge(key, record) == "sum of [-1.0, -2.0]"


# --- graded runs: a fresh process per exercise, an audit hook ------------------------------------

HONEST = "def f(x):\n    return x.abs()\n"
SETUP = ["import torch\nfrom course_tools.student import checks"]


def _graded_all(answers: dict[str, str], tests: str = TESTS) -> dict[str, tuple[str | None, list[str]]]:
    """Each answer in its own graded run (one runner for all), judged: {name: (problem, events)}."""
    key = _key_and_record(HONEST, tests)[0]
    req = {"recording": True, "timeout": 30, "setup": SETUP,
           "exercises": [{"name": name, "names": ["f"], "answer": answer,
                          "tests": verdicts.answer_side(tests)}
                         for name, answer in answers.items()]}
    results = verdicts.run_elsewhere(req, 300)
    return {name: (verdicts.judge(key, r), r["events"]) for name, r in results.items()}


def _graded(answer: str, tests: str = TESTS) -> tuple[str | None, list[str]]:
    return _graded_all({"one": answer}, tests)["one"]


ATTACKS = {
    "frames": "import sys\ndef f(x):\n    return sys._getframe(1).f_locals['x'].abs()\n",
    "frames through inspect": "import inspect\ndef f(x):\n    inspect.currentframe()\n    return x.abs()\n",
    "gc": "import gc\ndef f(x):\n    gc.get_referrers(x)\n    return x.abs()\n",
    "a traceback's frame": "def f(x):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n"
                           "        e.__traceback__.tb_frame.f_back\n    return x.abs()\n",
    "ctypes": "import ctypes\ndef f(x):\n    ctypes.pythonapi.Py_IsInitialized()\n    return x.abs()\n",
    "a trace function": "import sys\nsys.settrace(lambda *a: None)\ndef f(x):\n    return x.abs()\n",
    # cancelled
    "an audit hook": "import sys\nsys.addaudithook(lambda *a: None)\ndef f(x):\n    return x.abs()\n",
    "frames in a thread": "import sys, threading\nthreading.Thread(target=lambda: sys._getframe()).start()\n"
                          "def f(x):\n    return x.abs()\n",
    "a signal handler": "import signal\nsignal.signal(signal.SIGALRM, print)\n"
                        "def f(x):\n    return x.abs()\n",
    "a code swap": "def f(x):\n    return x.abs()\ndef g(x):\n    return x\nf.__code__ = g.__code__\n",
    "code under a library's name": "def f(x):\n    return x.abs()\n"
                                   "f = type(f)(f.__code__.replace(co_filename='/usr/lib/x.py'), "
                                   "globals())\n",
    "raw memory": "def f(x):\n    open('/proc/self/mem', 'rb')\n    return x.abs()\n",
    "raw memory from a folder": "import os\ndef f(x):\n    d = os.open('/proc/self', os.O_RDONLY)\n"
                                "    os.open('mem', os.O_RDONLY, dir_fd=d)\n    return x.abs()\n",
    "a process": "import subprocess\nsubprocess.run(['true'])\ndef f(x):\n    return x.abs()\n",
}


ANSWERS_IN_A_THREAD = ("import concurrent.futures\ndef f(x):\n"
                       "    with concurrent.futures.ThreadPoolExecutor(1) as pool:\n"
                       "        return pool.submit(torch.abs, x).result()\n")
HIDDEN = base64.b64encode(b"import sys\nframe = sys._getframe(0)").decode()
STEAL = ("import course_tools.student.checks as c\nreal = c.assert_close\n"
         "c.assert_close = lambda a, e, *r, **k: real(e, e, *r, **k)\ndef f(x):\n    return x\n")
OTHERS = {
    "copies the expected value": STEAL,
    "base64 exec": f"import base64\nexec(base64.b64decode({HIDDEN!r}))\n" + HONEST,
    "honest": ("import collections, dataclasses, functools\nP = collections.namedtuple('P', 'a b')\n"
               "@dataclasses.dataclass\nclass C:\n    a: int = 1\n"
               "@torch.no_grad()\n@functools.lru_cache\ndef g(n):\n    return n\n" + HONEST),
    "honest tools": ("import traceback, concurrent.futures\n"
                     "try:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
                     "    text = traceback.format_exc()\n"
                     "%timeit -n 1 -r 1 sum(range(10))\n"
                     "@torch.jit.script\ndef g(x: torch.Tensor) -> torch.Tensor:\n    return x.abs()\n"
                     "def f(x):\n    return g(x)\n"),
    "a thread pool": ("import concurrent.futures\ndef f(x):\n"
                      "    with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
                      "        return torch.stack(list(pool.map(torch.abs, x)))\n"),
    "frames through logging": "import logging\ndef f(x):\n    logging.currentframe().f_back\n"
                              "    return x.abs()\n",
    "another magic": "%pip install nothing\n" + HONEST,
    "raw memory through a library": "import pathlib\ndef f(x):\n"
                                    "    pathlib.Path('/proc/self/mem').read_bytes()\n"
                                    "    return x.abs()\n",
    "printed record": (
        f"print({json.dumps({'name': 'printed record', 'result': {'checks': [], 'error': None}})!r})\n"
        "import sys\nsys.stdout.flush()\ndef f(x):\n    return x\n"),
}


PATCHED_LIBRARY = ("import torch.nn.functional as F, importlib\n"
                   "setattr(importlib.import_module('course_tools.student.' + 'checks'), "
                   "'assert_close', print)\n"
                   "F.softmax = None\ndel torch.abs\n" + HONEST)


@pytest.fixture(scope="module")
def attacked():
    return _graded_all(ATTACKS | OTHERS | {"patched library": PATCHED_LIBRARY})


@pytest.mark.parametrize("name", list(ATTACKS))
def test_introspection_is_refused_to_the_answer_and_reported(attacked, name):
    problem, events = attacked[name]
    # CPython does not add the hook, and says nothing to the caller; a thread's error stays its own
    if name not in ("an audit hook", "frames in a thread"):
        assert problem is not None and "not allowed while an answer is graded" in problem, problem
    assert events and all("<answer>" in e for e in events), events


def test_code_hidden_in_a_base64_exec_is_the_answers_and_is_reported(attacked):
    problem, events = attacked["base64 exec"]
    assert "not allowed" in problem and any(e.startswith("exec in") for e in events), events
    assert any("sys._getframe in <string>" in e for e in events), events


def test_an_honest_answer_passes_with_no_event_even_using_libraries_that_introspect(attacked):
    assert attacked["honest"] == (None, [])


@pytest.mark.parametrize("name", ["honest tools", "a thread pool"])
def test_ordinary_tools_work_in_a_graded_run(attacked, name):
    assert attacked[name] == (None, [])


def test_a_thread_is_refused_inside_a_check_of_what_the_answer_calls():
    tests = "x = torch.tensor([-1.0, 2.0])\nwith checks.forbidding([torch.sort], 'no sort'):\n" \
        "    y = f(x)\n" + TESTS
    problem, events = _graded(ANSWERS_IN_A_THREAD, tests)
    assert "a thread, in a check of what the answer calls" in problem and events, (problem, events)


def test_frames_from_a_library_that_hands_them_out_are_refused(attacked):
    problem, events = attacked["frames through logging"]
    assert "sys._getframe is not allowed" in problem and events == ["sys._getframe in <answer>"], events


def test_a_magic_other_than_timing_fails_with_words_that_say_so(attacked):
    assert "magic %pip is not run by the grader" in attacked["another magic"][0]


def test_an_answer_that_copies_the_expected_value_has_none_to_copy(attacked):
    assert attacked["copies the expected value"][0] is not None


def test_what_the_answer_prints_is_never_read(attacked):
    assert attacked["printed record"][0] is not None


def test_raw_memory_is_refused_whoever_opens_it(attacked):
    problem, events = attacked["raw memory through a library"]
    assert "reading raw memory" in problem and "not allowed" in problem, problem
    assert events and "reading raw memory" in events[0], events


CHANNEL_ATTACK = """
import json, os, signal
def f(x):
    forged = json.dumps({"one": {"checks": [], "error": None}, "two": {"checks": [], "error": None}})
    for target in ("/proc/1/fd/1", f"/proc/{os.getppid()}/fd/1", "/proc/1/fd/0", "/proc/1/environ"):
        try:
            with open(target, "w") as out:
                out.write(forged + "x" * 2**20)
        except OSError:
            pass
    for pid in (1, os.getppid()):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    return x
"""


def test_no_answer_reaches_the_sandboxed_runner_its_output_or_its_memory():
    """The runner is the sandbox's init and non-dumpable: an answer that writes forged results into
    its output, reads its memory or signals it changes nothing; the next exercise is still run."""
    from course_tools.grading.grader import sandbox
    from tests.conftest import skip_or_fail

    if sandbox.unavailable():
        skip_or_fail(f"no sandbox: {sandbox.unavailable()}")
    key = _key_and_record(HONEST, TESTS)[0]
    req = {"recording": True, "timeout": 30, "setup": SETUP,
           "exercises": [{"name": name, "names": ["f"], "answer": answer,
                          "tests": verdicts.answer_side(TESTS)}
                         for name, answer in (("one", CHANNEL_ATTACK), ("two", HONEST))]}
    out, failure, _ = sandbox._confined(
        [sys.executable, "-I", "-m", "course_tools.grading.sandboxed.graded_run", "run", "120"],
        json.dumps(req), sandbox.Limits(), sandboxed=True, cwd=None, as_init=True)
    assert failure is None, failure
    results = json.loads(out)  # one document: the runner's own
    assert set(results) == {"one", "two"}
    assert verdicts.judge(key, results["one"]) is not None and verdicts.judge(key, results["two"]) is None


def test_what_comes_out_of_a_sandbox_is_read_up_to_a_cap():
    from course_tools.grading.grader import sandbox

    limits = sandbox.Limits(output_bytes=2**20)
    out, failure, _ = sandbox._confined([sys.executable, "-c", "import sys; sys.stdout.write('x' * 2**24)"],
                                        "", limits, sandboxed=False, cwd=None)
    assert out == "" and "more than 1 MiB" in failure
    out, failure, _ = sandbox._confined([sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"],
                                        "abc", limits, sandboxed=False, cwd=None)
    assert (out, failure) == ("cba\n", None)


BORROWED_TESTS = "checks.assert_close(causal_mask(3), torch.ones(3, 3).triu(1).bool(), 'causal_mask(3)')"
BORROWERS = {
    "spelled at run time": "import importlib\n_m = importlib.import_module('course_lib.' + 'attention')\n"
                           "causal_mask = getattr(_m, 'causal' + '_mask')\n",
    "renamed": "import functools\nfrom course_lib import attention as _a\n"
               "causal_mask = functools.partial(_a.causal_mask)\n",
    "called inside": "from course_lib import attention as _a\n"
                     "def causal_mask(n):\n    return _a.causal_mask(n)\n",
    "only when graded": "import sys\nfrom course_lib import attention as _a\n"
                        "def causal_mask(n):\n"
                        "    if 'IPython' not in sys.modules or not sys.stdout.isatty():\n"
                        "        return _a.causal_mask(n)\n    raise NotImplementedError\n",
    "its code read": "from course_lib import attention as _a\n_c = _a.causal_mask.__code__\n"
                     "def causal_mask(n):\n    return torch.ones(n, n).triu(1).bool()\n",
    "honest": "def causal_mask(n):\n    return torch.ones(n, n).triu(1).bool()\n",
}


@pytest.fixture(scope="module")
def borrowed():
    req = {"recording": True, "timeout": 30, "setup": SETUP + ["from course_lib import attention"],
           "exercises": [{"name": "ex_causal_mask", "names": ["causal_mask"], "answer": answer,
                          "tests": verdicts.answer_side(BORROWED_TESTS)} for answer in BORROWERS.values()]}
    # one runner per answer: each exercise of a request needs its own name
    out = {}
    for label, ex in zip(BORROWERS, req["exercises"], strict=True):
        out[label] = verdicts.run_elsewhere(dict(req, exercises=[ex]), 300)["ex_causal_mask"]
    return out


@pytest.mark.parametrize("label", ["spelled at run time", "renamed", "called inside", "only when graded"])
def test_a_call_of_the_exercises_own_reference_is_seen_whatever_its_spelling(borrowed, label):
    result = borrowed[label]
    assert result["error"] is None  # flagged, not failed: the instructor reads the flag
    assert "course_lib's course_lib.attention.masks.causal_mask" in result["events"][-1], result["events"]
    assert all("this exercise's reference" in e for e in result["events"]), result["events"]


def test_the_reference_code_is_out_of_reach_and_an_honest_answer_is_not_flagged(borrowed):
    assert "reading a reference's code is not allowed" in borrowed["its code read"]["error"]
    assert borrowed["honest"]["events"] == [] and borrowed["honest"]["error"] is None


def test_the_reference_given_as_the_answer_is_seen_by_identity(borrowed):
    assert any("as the answer's causal_mask" in e for e in borrowed["renamed"]["events"]), borrowed["renamed"]


def test_the_tests_run_with_the_libraries_as_released_whatever_the_answers_cell_changed(attacked):
    problem, events = attacked["patched library"]
    assert problem is None, problem  # checks.assert_close and torch.abs are back for the tests
    assert sorted(events) == [
        "changed course_tools.student.checks.assert_close (put back for the tests) in <answer>",
        "changed torch.abs (put back for the tests) in <answer>",
        "changed torch.nn.functional.softmax (put back for the tests) in <answer>"], events
