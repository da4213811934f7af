"""What test cells use to judge an answer: one tolerance policy and messages a student can act on.

A test cell compares the student's answer with a reference computed **in float64 from the same
inputs** (``to_float64`` makes the float64 copy of tensors, modules and containers), never with a
float32 reference that has rounding errors of its own. Inputs come from a local generator
(``rng(seed)``), so a verdict never depends on which cells ran before.

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

What is *not* checked unless the exercise text states it: the dtype of the answer (a float64
answer to a float32 question is fine), whether a number is a Python float, a 0-d tensor or a
NumPy scalar, the container type of a sequence. ``assert_close`` converts whatever it gets with
``torch.as_tensor`` and compares values; ``dtype=`` and ``types=`` check them when the text asks.

Every failed check raises ``AssertionError`` whose message starts with ``what`` (the case, in the
exercise's words: which input, which property) and says what was expected and what came back.

Where the verdict is decided. In a student's kernel (the self-check, the book) each check judges at
once. When an exercise is graded, :mod:`course_lib.grading.verdicts` runs the same test code twice,
in two processes that never meet: in the sandbox, with the student's answer, each check only
*records* what the answer gave (``actual``, as plain data; the test code runs there with every
``expected`` argument removed); outside, with the instructor's solution, each check records its
``expected`` value and parameters as the *answer key*. The grader then applies the same judges,
here, to the recorded data. ``_session`` is what a check reports to while that happens.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "assert_close", "assert_equal", "assert_follows_device", "assert_true", "assert_grads_close",
    "assert_raises", "call_unchanged",
    "forbidding", "number", "rng", "to_float64", "tolerance",
]

# Unit roundoff (half the machine epsilon) of each floating-point format.
_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8,
             torch.float16: 2.0**-11}
SAFETY = 64  # chained operations and u * n growth of short sums, on any kernel or thread count
_session = None  # a verdicts.Session while a graded run records or an answer key is made


def _check(kind: str, what: str, actual, expected, **params) -> None:
    """Judge at once, or hand the check to the session (see the module docstring)."""
    if _session is None:
        JUDGES[kind](actual, expected, what, **params)
    else:
        _session.check(kind, what, actual, expected, params)


def _reference(compute: Callable):
    """``compute()``, the expected value of a check: the checks it makes itself (a test's guard on
    its own inputs) are not part of the answer key (the graded run never computes references)."""
    if _session is None:
        return compute()
    _session.quiet += 1
    try:
        return compute()
    finally:
        _session.quiet -= 1


def _recording() -> bool:
    """Whether this run only records the answer's side (the sandbox of a graded run)."""
    return _session is not None and _session.recording


def rng(seed: int) -> torch.Generator:
    """A local CPU generator: ``torch.randn(..., generator=rng(0))`` gives the same inputs whatever
    ran before."""
    return torch.Generator().manual_seed(seed)


def tolerance(dtype: torch.dtype = torch.float32, terms: int = 1) -> float:
    """The relative tolerance for a correct answer computed in ``dtype`` with sums of ``terms`` terms."""
    if dtype not in _ROUNDOFF:
        raise ValueError(f"tolerance: expected a floating dtype out of {list(_ROUNDOFF)}, got {dtype}")
    if terms < 1:
        raise ValueError(f"tolerance: terms must be at least 1, got {terms}")
    return SAFETY * _ROUNDOFF[dtype] * math.sqrt(terms)


def to_float64(obj):
    """A float64 copy of ``obj``: a tensor, an ``nn.Module`` (deep-copied) or a list, tuple or dict
    of them; integer and bool tensors and everything else come back as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(torch.float64) if obj.is_floating_point() else obj
    if isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to(torch.float64)
    if isinstance(obj, Mapping):
        return type(obj)({k: to_float64(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_float64(v) for v in obj)
    return obj


def _as_tensor(value, what: str, role: str) -> torch.Tensor:
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


def assert_close(actual, expected, what: str, *, precision: torch.dtype = torch.float32, terms: int = 1,
                 scale: float | None = None, equal_nan: bool = False, types=None, dtype=None) -> None:
    """Check ``actual`` against the float64 ``expected``, elementwise, by the module's policy.

    ``precision`` is the format the answer is meant to be computed in (that of the inputs), not
    the dtype it comes back in; ``terms`` the length of the longest sum; ``scale`` the size of the
    terms where the result cancels (default: the largest ``|expected|``). Infinities must match
    exactly (a masked score is ``-inf``, not ``-1e9``); NaN only where ``equal_nan``. ``types``
    and ``dtype`` check the answer's Python type and tensor dtype, for exercises that state them.
    """
    _check("close", what, actual, expected, precision=precision, terms=terms, scale=scale,
           equal_nan=equal_nan, types=types, dtype=dtype)


def _judge_close(actual, expected, what: str, *, precision=torch.float32, terms=1, scale=None,
                 equal_nan=False, types=None, dtype=None) -> None:
    _check_type(actual, what, types, dtype)
    got = _as_tensor(actual, what, "the answer")
    want = _as_tensor(expected, what, "the reference")
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


def assert_equal(actual, expected, what: str, *, types=None, dtype=None) -> None:
    """Exact equality for integers, bools, token ids, shapes and strings (compared as values:
    a list and a tensor with the same entries are equal unless ``types`` says otherwise)."""
    _check("equal", what, actual, expected, types=types, dtype=dtype)


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
        got, want = _as_tensor(actual, what, "the answer"), _as_tensor(expected, what, "the reference")
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


def assert_true(condition, what="") -> None:
    """An observation that must hold (``what``: the message, or a function that makes it when it
    does not). The graders turn a test cell's ``assert`` statements into this check."""
    ok = bool(condition)
    _check("true", (what() if callable(what) else what) if not ok else "", ok, True)


def _judge_true(ok, expected, what: str) -> None:
    if ok is not True:
        raise AssertionError(what or "a check of the tests failed")


def number(value, what: str) -> float:
    """``value`` as a Python float: accepts a float, an int, a 0-d or one-element tensor or array."""
    if isinstance(value, bool):
        raise AssertionError(f"{what}: expected a number, got a bool")
    t = _as_tensor(value, what, "the answer")
    if t.numel() != 1:
        raise AssertionError(f"{what}: expected a single number, got shape {tuple(t.shape)}")
    return float(t.reshape(()).item())


def _inputs_snapshot(args, kwargs):
    return [(k, v, v.detach().clone()) for k, v in [*enumerate(args), *kwargs.items()]
            if isinstance(v, torch.Tensor)]


def call_unchanged(fn: Callable, *args, what: str, **kwargs):
    """``fn(*args, **kwargs)``, failing if the call changed any tensor argument in place."""
    before = _inputs_snapshot(args, kwargs)
    out = fn(*args, **kwargs)
    changed = [f"argument {key + 1}" if isinstance(key, int) else f"argument {key!r}"
               for key, tensor, copy_ in before
               if tensor.shape != copy_.shape or not torch.equal(tensor.detach(), copy_)]
    _check("unchanged", what, changed, [])
    return out


def _judge_unchanged(changed, expected, what: str) -> None:
    if changed:  # the names of the arguments changed in place, as observed while the answer ran
        name = changed[0] if isinstance(changed, list) else repr(changed)
        raise AssertionError(f"{what}: the function changed its {name} in place; "
                             "it must leave its inputs as they were")


def _name(fn) -> str:
    """``torch.logsumexp``, ``Tensor.logsumexp``, ``torch.nn.functional.log_softmax``,
    ``torch.ops.aten.native_layer_norm.default``."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return f"torch.ops.{fn}"
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str):
        return repr(fn)[:80]
    if hasattr(fn, "__objclass__"):  # a tensor method
        return f"Tensor.{name}"
    module = getattr(fn, "__module__", None) or "torch"
    if module.startswith("torch._") and getattr(torch, name, None) is fn:
        module = "torch"  # torch._C._VariableFunctions.logsumexp is torch.logsumexp
    return f"{module}.{name}"


def _operator(name: str) -> str:
    """The operator a torch name stands for, the same for the public function, its tensor method,
    its binding and the aten operators behind it: ``native_layer_norm.default``, ``layer_norm`` and
    ``aten::layer_norm`` give ``layer_norm``; ``_log_softmax``, ``special_log_softmax`` give
    ``log_softmax``; ``nll_loss_forward``, ``nll_loss2d``, ``nll_loss_nd`` and ``nll_loss`` give
    ``nll``; ``cross_entropy_loss`` and ``cross_entropy`` give ``cross_entropy``."""
    n = name.lower().rsplit("::", 1)[-1].split(".")[0].strip("_")
    n = re.sub(r"^(native|fused|special)_", "", n)
    n = re.sub(r"_(forward|out)$", "", n)
    n = re.sub(r"(_nd|2d)$", "", n)
    return re.sub(r"_loss$", "", n)


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _python_level(fn) -> bool:
    """A torch function written in Python (``F.layer_norm``, ``Tensor.backward``): a public
    function of its own, as opposed to a binding of one aten operator (``torch.layer_norm``,
    ``x.softmax``, ``torch.ops.aten.native_layer_norm``, ``torch._C._nn.cross_entropy_loss``)."""
    return hasattr(inspect.unwrap(fn), "__code__")


class _Watch:
    """What one ``forbidding`` block has seen: the names of the forbidden calls, and how deep the
    code is inside an allowed torch function written in Python (whose own operators are its
    business, not the answer's)."""

    def __init__(self, functions):
        self.funcs = frozenset(functions)
        # operator -> the public name it is forbidden under (torch functions only: a course_lib
        # function or a Python helper has no operator of its own)
        self.operators: dict[str, str] = {}
        for f in functions:
            name = getattr(f, "__name__", "")
            if name and not _is_dunder(name) and _name(f).startswith(("torch.", "Tensor.")):
                self.operators.setdefault(_operator(name), _name(f))
        self.called: list[str] = []
        self.allowed_depth = 0
        self.binding = None  # the last binding the answer called, to name it when its operator is refused

    def record(self, name: str) -> None:
        if name not in self.called:
            self.called.append(name)


class _CallWatch(torch.overrides.TorchFunctionMode):
    """Sees every torch function and tensor method the code inside calls directly, however it
    was named (``torch.logsumexp``, ``x.logsumexp()``, an alias made at import time), and every
    binding of the same operator (``torch.layer_norm``, ``torch.ops.aten.native_layer_norm``)."""

    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        w, name = self.watch, getattr(func, "__name__", None)
        alias = isinstance(name, str) and not _is_dunder(name) and _operator(name) in w.operators
        if func in w.funcs or alias:
            w.record(_name(func) if func in w.funcs or _name(func) in w.operators.values()
                     else f"{_name(func)} (the operator of {w.operators[_operator(name)]})")
        elif not _python_level(func):  # a binding: the operators it runs are judged below
            w.binding = func
            return func(*args, **(kwargs or {}))
        w.allowed_depth += 1  # inside a function judged as a whole: its operators are not the answer's
        try:
            return func(*args, **(kwargs or {}))
        finally:
            w.allowed_depth -= 1


class _OperatorWatch(TorchDispatchMode):
    """Sees the aten operators that run outside any allowed torch function written in Python: a
    forbidden function's operator reached through a binding of another name
    (``torch._C._nn.nll_loss_nd``), or with torch-function modes switched off."""

    def __init__(self, watch: _Watch):
        super().__init__()
        self.watch = watch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        w = self.watch
        if not w.allowed_depth and w.operators:
            public = w.operators.get(_operator(func.__name__))
            if public is not None:
                binding = _name(w.binding) if w.binding is not None else ""
                via = f"{binding}, which runs " if binding and binding != f"torch.ops.{func}" else ""
                w.record(f"{via}torch.ops.{func} (the operator of {public})")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def forbidding(functions: Sequence[Callable], what: str):
    """Fail the check ``what`` if the code inside the block calls any of ``functions``, the
    built-ins an exercise asks the student not to use. Torch functions and tensor methods are
    seen through a torch-function mode and Python functions (``torch.nn.utils.clip_grad_norm_``,
    ``course_lib``'s own) through their code objects, so renaming or aliasing a function does not
    hide the call; the calls are recorded and judged after the block, so catching an exception
    inside does not hide them either. Calls made *by* a watched torch function are not counted.

    A forbidden torch function is also refused as its operator: every binding of the same aten
    operator (``torch.layer_norm``, ``torch.native_layer_norm``, ``x.log_softmax``,
    ``torch.ops.aten.native_layer_norm.default``, ``torch._C._nn.cross_entropy_loss``: the names
    that ``_operator`` maps to one), and the operator itself wherever it runs outside an allowed
    torch function written in Python. Such a function (``F.cross_entropy`` while only
    ``log_softmax`` is forbidden) is judged as a whole: the operators it runs inside are its own,
    so an allowed function that shares low-level operators with a forbidden one is not refused."""
    # A decorated function's own code, not its decorator's wrapper (shared by every function
    # @torch.no_grad() decorates, the student's own among them).
    unwrapped = [inspect.unwrap(f) for f in functions]
    codes = {f.__code__: _name(f) for f in unwrapped if hasattr(f, "__code__")}
    watch = _Watch(functions)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            watch.record(codes[frame.f_code])

    previous = sys.getprofile()
    if codes:  # a profile hook slows every call, so only when there is a Python function to see
        sys.setprofile(profile)
    sys.audit("course.forbidding", True)  # a graded run's guard: no thread starts in the block
    try:
        operators = _OperatorWatch(watch) if watch.operators else contextlib.nullcontext()
        with _eager(), operators, _CallWatch(watch):
            yield
    finally:
        sys.audit("course.forbidding", False)
        sys.setprofile(previous)
        _check("forbidden", what, list(watch.called), [])


@contextlib.contextmanager
def _eager():
    """torch.compile runs the function as written inside the block: dynamo cannot trace under a
    profile hook and a torch-function mode (an internal error), and the watch must see every call."""
    was = os.environ.get("TORCH_COMPILE_DISABLE")
    os.environ["TORCH_COMPILE_DISABLE"] = "1"  # read when torch._dynamo is first imported
    loaded = "torch._dynamo" in sys.modules
    try:
        with sys.modules["torch._dynamo"].config.patch(disable=True) if loaded else contextlib.nullcontext():
            yield
    finally:
        if was is None:
            del os.environ["TORCH_COMPILE_DISABLE"]
            if not loaded and "torch._dynamo" in sys.modules:  # imported in the block, disabled
                sys.modules["torch._dynamo"].config.disable = False
        else:
            os.environ["TORCH_COMPILE_DISABLE"] = was


def _judge_forbidden(called, expected, what: str) -> None:
    if called:
        name = called[0] if isinstance(called, list) else repr(called)
        raise AssertionError(f"{what}: the answer called {name}, which this exercise asks you not to use; "
                             "compute it yourself")


def _to_meta(obj):
    """``obj`` on PyTorch's meta device (shapes and dtypes, no values): tensors, modules (copied)
    and lists, tuples and dicts of them; everything else as it is."""
    if isinstance(obj, torch.Tensor):
        meta = torch.empty_like(obj.detach(), device="meta")
        return meta.requires_grad_() if obj.requires_grad else meta
    if isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to("meta")
    if isinstance(obj, Mapping):
        return type(obj)({k: _to_meta(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_meta(v) for v in obj)
    return obj


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


# Operators that take tensors of another device by design: CPU indices into a GPU tensor, and a
# copy into a tensor of the input's device. Into a tensor of another device, they keep the
# answer's values there.
_WRITES_ACROSS_DEVICES = {"copy_", "index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index",
                          "_unsafe_index_put"}


class _DeviceWatch(TorchDispatchMode):
    """Notes each operator that combines a tensor on the meta device with a tensor of more than one
    element made elsewhere: on a GPU that is an error ("expected all tensors to be on the same
    device"), which the meta device does not always raise (a matmul with a CPU matrix runs there).
    A 0-d CPU tensor mixes with any device, as on a GPU; so do CPU indices, and a copy into the
    input's device (but not a copy of its values into a tensor on the CPU, nor ``x.cpu()``)."""

    def __init__(self):
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = _tensors(list(args) + list((kwargs or {}).values()))
        on_meta = [t.device.type == "meta" for t in tensors]
        if any(on_meta):
            name = func.__name__.split(".")[0]
            if name in _WRITES_ACROSS_DEVICES:
                mixed = isinstance(args[0], torch.Tensor) and args[0].device.type != "meta"
            elif name == "_to_copy":  # x.cpu(), x.to("cpu"): the answer's values leave x's device
                device = (kwargs or {}).get("device")
                mixed = device is not None and torch.device(device).type != "meta"
            else:
                mixed = any(not m and t.dim() > 0 for t, m in zip(tensors, on_meta, strict=True))
            if mixed:
                self.mixed.append(f"torch.ops.{func}")
        return func(*args, **(kwargs or {}))


def _describe(out) -> list:
    return [[t.device.type, list(t.shape), str(t.dtype).removeprefix("torch.")] for t in _tensors(out)]


def assert_follows_device(fn: Callable, *args, what: str, **kwargs):
    """For exercises whose text says the answer works on any device (a GPU as well as the CPU):
    ``fn(*args, **kwargs)`` is called on the CPU and again with its tensors and modules on PyTorch's
    ``meta`` device, which has shapes and dtypes but no values, so that a tensor the answer makes
    on the CPU instead of its input's device shows without a GPU. The check fails if the answer
    then combines the input's device with a tensor made elsewhere, or returns tensors that are not
    on the meta device or not of the shapes and dtypes it returns on the CPU. An answer that needs
    values to run (``.item()``, ``if x.any():``) cannot be run on meta: that is no error, and the
    case then says nothing. Returns the CPU result."""
    out = fn(*args, **kwargs)
    meta_args, meta_kwargs = _to_meta(args), _to_meta(kwargs)
    watch = _DeviceWatch()
    error = None
    try:
        with watch:
            meta_out = fn(*meta_args, **meta_kwargs)
    except Exception as e:  # noqa: BLE001 (judged below: mixed devices, or values that meta has not)
        error, meta_out = f"{type(e).__name__}: {e}"[:300], None
    observed = {"mixed": watch.mixed[:3], "error": error, "meta": _describe(meta_out), "cpu": _describe(out)}
    _check("device", what, observed, None)
    return out


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


def _grads(fn: Callable, inputs: Sequence[torch.Tensor], weights_seed: int, what: str):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor to differentiate, got {type(out).__name__}")
    if not out.requires_grad:
        raise AssertionError(f"{what}: the result carries no gradient to its inputs "
                             "(is it detached, or computed outside autograd?)")
    weights = torch.randn(out.shape, generator=rng(weights_seed), dtype=torch.float64).to(out.dtype)
    (out * weights.to(out.device)).sum().backward()
    return leaves


def assert_grads_close(answer: Callable, reference: Callable, inputs: Sequence[torch.Tensor], what: str,
                       *, precision: torch.dtype = torch.float32, terms: int = 1, seed: int = 0) -> None:
    """Gradients of ``answer(*inputs)`` with respect to every input, by value, against the
    gradients of ``reference`` on float64 copies. Both outputs are contracted with the same random
    weights (``seed``), so every output element's gradient counts. An input that gets no
    gradient where the reference has one fails. ``reference`` receives float64 tensors that
    require grad: it must not detach them (``to_float64`` does), or it has no gradient to compare."""
    got = [leaf.grad for leaf in _grads(answer, inputs, seed, what)]
    want = None if _recording() else [
        leaf.grad for leaf in _grads(reference, [to_float64(x) for x in inputs], seed,
                                     f"{what} (the reference)")]
    _check("grads", what, got, want, precision=precision, terms=terms)


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


def assert_raises(error: type[BaseException] | tuple, fn: Callable, *args, what: str, **kwargs) -> None:
    """``fn(*args, **kwargs)`` must raise ``error`` (for exercises whose text asks for it)."""
    try:
        fn(*args, **kwargs)
        raised = None
    except Exception as e:  # noqa: BLE001 (any error is observed; only ``error`` passes)
        raised = {"classes": [_class_name(c) for c in type(e).__mro__],
                  "text": f"{type(e).__name__}: {e}"[:300]}
    errors = error if isinstance(error, tuple) else (error,)
    _check("raises", what, raised, [_class_name(c) for c in errors])


def _class_name(cls: type) -> str:
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
