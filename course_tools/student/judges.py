"""The rules a check applies: one tolerance policy, and messages a student can act on.

Each ``_judge_*`` function decides one kind of check from two values, the answer's and the
reference's, and raises ``AssertionError`` (its message starts with ``what``) when the answer
fails. The same rules run everywhere a verdict is decided: at once in a student's kernel
(:mod:`.checks`), and on recorded data in the grader's process
(:func:`course_tools.grading.grader.verdicts.judge`) and the self-check.

The tolerance policy (``tolerance``). A correct answer computed in a floating-point format with
unit roundoff ``u`` (float32: 2**-24, about 6e-8; bfloat16: 2**-8; float16: 2**-11; float64:
2**-53) differs from the exact result by rounding errors that grow with the length ``n`` of the
longest sum it contains (a dot product over ``D``, a softmax over ``V``, a cumulative sum): in
practice like ``u * sqrt(n)``, in the worst case like ``u * n``. Another CPU, another thread count
or a GPU changes the order of those sums, so the errors of two correct answers are independent.
We allow

    |answer - reference| <= tol * (|reference| + scale),   tol = 64 * u * sqrt(n)

elementwise, where ``scale`` is the largest ``|reference|`` over the whole tensor (so an element
that cancels to nearly zero is judged against the size of the values around it) unless the test
passes the size of the terms that cancel, plus a floor of ``64 * tiny`` (the smallest normal
number of the format) so that a value that legitimately underflows to 0 is not an error.
For float32 and ``n = 1`` that is ``3.8e-6``; for
``n = 1000``, ``1.2e-4``. The factor 64 covers a few chained operations and ``u * n`` growth for
short sums; a wrong answer (a missing scale, a wrong axis, an off-by-one) is off by far more.
Tests whose answer goes through many layers pass ``terms`` = the number of multiply-adds along
the longest path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch

# Unit roundoff (half the machine epsilon) of each floating-point format.
_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
             torch.float16: 2.0**-11}


SAFETY = 64  # chained operations and u * n growth of short sums, on any kernel or thread count


def tolerance(dtype: torch.dtype = torch.float32, terms: int = 1) -> float:
    """The relative tolerance for a correct answer computed in ``dtype`` with sums of ``terms`` terms."""
    if dtype not in _ROUNDOFF:
        raise ValueError(f"tolerance: expected a floating dtype out of {list(_ROUNDOFF)}, got {dtype}")
    if terms < 1:
        raise ValueError(f"tolerance: terms must be at least 1, got {terms}")
    return SAFETY * _ROUNDOFF[dtype] * math.sqrt(terms)


def as_tensor(value, what: str, role: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:  # through NumPy, so that a Python float stays float64 (torch.as_tensor would round it to float32)
        return torch.from_numpy(np.array(value))
    except (TypeError, ValueError, RuntimeError):
        pass
    try:
        return torch.as_tensor(value).cpu()
    except (TypeError, ValueError, RuntimeError) as e:
        raise AssertionError(f"{what}: expected {role} to be a number or an array of numbers, "
                             f"got {type(value).__name__} ({str(e)[:80]})") from None


def _show(t: torch.Tensor, limit: int = 8) -> str:
    """A short picture of a tensor for a message: its values if few, else its shape."""
    return str(t.tolist()) if t.numel() <= limit else f"{t.numel()} values of shape {tuple(t.shape)}"


def _check_type(value, what: str, types, dtype) -> None:
    if types is not None and not isinstance(value, types):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise AssertionError(f"{what}: expected type {names}, got {type(value).__name__}")
    if dtype is not None:
        got = getattr(value, "dtype", type(value).__name__)
        if got != dtype:
            raise AssertionError(f"{what}: expected dtype {dtype} (the exercise asks for it), got {got}")


def _judge_close(actual, expected, what: str, *, precision=torch.float32, terms=1, scale=None,
                 equal_nan=False, types=None, dtype=None) -> None:
    _check_type(actual, what, types, dtype)
    got = as_tensor(actual, what, "the answer")
    want = as_tensor(expected, what, "the reference")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, got shape {tuple(got.shape)}")
    if got.is_complex() or want.is_complex():
        raise AssertionError(f"{what}: complex values are not expected here")
    got, want = got.to(torch.float64), want.to(torch.float64)
    tol = tolerance(precision, terms)
    finite = torch.isfinite(want)
    size = scale if scale is not None else (want[finite].abs().max().item() if finite.any() else 0.0)
    bound = tol * (want.abs() + size) + SAFETY * torch.finfo(precision).tiny  # underflow is no error
    diff = (got - want).abs()
    bad = ~(diff <= bound)  # NaN differences count as bad
    bad &= finite  # infinities and NaN are judged below
    inf = torch.isinf(want)
    bad |= inf & (got != want)
    nan = torch.isnan(want)
    bad |= (nan & ~torch.isnan(got)) if equal_nan else nan
    if bad.any():
        n_bad = int(bad.sum())
        where = tuple(int(i) for i in bad.nonzero()[0]) if want.dim() else ()
        g, w = got[where].item(), want[where].item()
        at = f" at index {list(where)}" if where else ""
        extra = f" ({n_bad} of {want.numel()} values off)" if want.numel() > 1 else ""
        raise AssertionError(
            f"{what}: expected {w:.8g}{at}, got {g:.8g}{extra}; a correct answer in {precision} "
            f"is within {bound[where].item():.2g} of it")


def _judge_equal(actual, expected, what: str, *, types=None, dtype=None) -> None:
    _check_type(actual, what, types, dtype)
    if isinstance(expected, (str, bytes)) or isinstance(actual, (str, bytes)):
        if actual != expected:
            raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")
        return
    if isinstance(expected, Mapping) or _structured(expected):
        _judge_structure(actual, expected, what)
        return
    if isinstance(expected, (int, float, bool)) and not isinstance(actual, torch.Tensor) and \
            not hasattr(actual, "shape"):
        ok = actual == expected
    else:
        got, want = as_tensor(actual, what, "the answer"), as_tensor(expected, what, "the reference")
        if tuple(got.shape) != tuple(want.shape):
            raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, got shape {tuple(got.shape)}"
                                 f" (expected {_show(want)}, got {_show(got)})")
        diff = got != want
        if diff.any():
            where = tuple(int(i) for i in diff.nonzero()[0]) if want.dim() else ()
            at = f" at index {list(where)}" if where else ""
            raise AssertionError(f"{what}: expected {_show(want)}, got {_show(got)}; first difference{at}: "
                                 f"expected {want[where].item()!r}, got {got[where].item()!r}")
        return
    if not ok:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def _structured(value) -> bool:
    """A list or tuple that is no array of numbers (pairs of a pair and an id, strings, ragged
    rows): compared as Python values."""
    if not isinstance(value, (list, tuple)):
        return False
    try:
        return np.array(value).dtype.kind in "OUS"  # objects, strings
    except ValueError:  # ragged
        return True


def _short(x, n: int = 160) -> str:
    r = repr(x)
    return r if len(r) <= n else r[:n] + " ..."


def _judge_structure(actual, expected, what: str) -> None:
    """Dicts by key (wrong, missing, extra entries); sequences item by item."""
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            raise AssertionError(f"{what}: expected a dict, got a {type(actual).__name__}: {_short(actual)}")
        actual = dict(actual)
        if actual == dict(expected):
            return
        wrong = [f"{k}: expected {expected[k]!r}, got {actual[k]!r}" for k in expected
                 if k in actual and actual[k] != expected[k]]
        missing = [f"{k} ({expected[k]!r})" for k in expected if k not in actual]
        extra = [f"{k}: {actual[k]!r}" for k in actual if k not in expected]
        problems = [label + ", ".join(items[:3]) + (" ..." if len(items) > 3 else "")
                    for label, items in [("wrong values ", wrong), ("missing keys ", missing),
                                         ("unexpected keys ", extra)] if items]
        both = f" (expected {expected}, got {actual})" if len(expected) + len(actual) <= 8 else ""
        raise AssertionError(f"{what}: {'; '.join(problems)}{both}")
    if not isinstance(actual, (list, tuple)):
        raise AssertionError(f"{what}: expected a sequence, got a {type(actual).__name__}: {_short(actual)}")
    if list(actual) == list(expected):
        return
    i = next((k for k, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b),
             min(len(actual), len(expected)))
    want = repr(expected[i]) if i < len(expected) else "nothing more"
    got = repr(actual[i]) if i < len(actual) else "nothing more"
    raise AssertionError(f"{what}: expected {len(expected)} items, got {len(actual)}; item {i + 1}: "
                         f"expected {want}, got {got}")


def _judge_true(ok, expected, what: str) -> None:
    if ok is not True:
        raise AssertionError(what or "a check of the tests failed")


def _judge_unchanged(changed, expected, what: str) -> None:
    if changed:  # the names of the arguments changed in place, as observed while the answer ran
        name = changed[0] if isinstance(changed, list) else repr(changed)
        raise AssertionError(f"{what}: the function changed its {name} in place; "
                             "it must leave its inputs as they were")


def _judge_forbidden(called, expected, what: str) -> None:
    if called:
        name = called[0] if isinstance(called, list) else repr(called)
        raise AssertionError(f"{what}: the answer called {name}, which this exercise asks you not to use; "
                             "compute it yourself")


def _judge_device(observed, expected, what: str) -> None:
    if not isinstance(observed, dict):
        raise AssertionError(f"{what}: the device check recorded {observed!r:.80}")
    hint = ("make every new tensor on the input's device (device=x.device, torch.zeros_like(x), "
            "x.new_zeros(...))")
    if observed.get("mixed"):
        raise AssertionError(
            f"{what}: with its inputs on another device than the CPU (here PyTorch's meta device), the "
            f"answer brought in the CPU, in {observed['mixed'][0]} (a tensor made there, or values moved "
            f"there); on a GPU that is an error or leaves the result on the CPU: {hint}")
    if observed.get("error"):
        return  # the answer needs values to run, which meta tensors do not have: nothing to judge
    got, want = observed.get("meta") or [], observed.get("cpu") or []
    if len(got) != len(want):
        raise AssertionError(f"{what}: on the meta device the answer returned {len(got)} tensors, "
                             f"on the CPU {len(want)}")
    for (device, shape, dtype), (_, cpu_shape, cpu_dtype) in zip(got, want, strict=True):
        if device != "meta":
            raise AssertionError(f"{what}: for inputs on the meta device the answer returned a tensor on "
                                 f"{device}: {hint}")
        if [shape, dtype] != [cpu_shape, cpu_dtype]:
            raise AssertionError(f"{what}: on the meta device the answer returned shape {tuple(shape)} and "
                                 f"dtype {dtype}, on the CPU shape {tuple(cpu_shape)} and dtype {cpu_dtype}")


def _judge_grads(got, want, what: str, *, precision=torch.float32, terms=1) -> None:
    if not isinstance(got, list) or len(got) != len(want):
        raise AssertionError(f"{what}: expected {len(want)} gradients, got {got!r:.80}")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w is None:
            continue
        if g is None:
            raise AssertionError(f"{what}: no gradient reached input {i + 1}; the reference has one "
                                 "(is the computation detached, or done outside autograd?)")
        _judge_close(g, w, f"{what}, gradient of input {i + 1}", precision=precision, terms=terms)


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _judge_raises(raised, expected: list, what: str) -> None:
    names = " or ".join(name.rsplit(".", 1)[-1] for name in expected)
    if raised is None:
        raise AssertionError(f"{what}: expected {names}, but the call returned normally")
    if not isinstance(raised, dict) or not set(raised.get("classes") or ()) & set(expected):
        text = raised.get("text") if isinstance(raised, dict) else repr(raised)
        raise AssertionError(f"{what}: expected {names}, got {text}")


JUDGES = {"close": _judge_close, "equal": _judge_equal, "unchanged": _judge_unchanged,
          "grads": _judge_grads, "raises": _judge_raises, "true": _judge_true, "forbidden": _judge_forbidden,
          "device": _judge_device}
