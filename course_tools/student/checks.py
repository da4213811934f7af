"""What test cells call to check an answer: ``assert_close``, ``forbidding``, ``rng``... (the rules
each check applies, and the tolerance policy, are :mod:`.judges`).

A test cell compares the student's answer with a reference computed **in float64 from the same
inputs** (``to_float64`` makes the float64 copy of tensors, modules and containers), never with a
float32 reference that has rounding errors of its own. Inputs come from a local generator
(``rng(seed)``), so a verdict never depends on which cells ran before.

The tolerance, ``tolerance(dtype, terms)``, is explained in :mod:`.judges`.

What is *not* checked unless the exercise text states it: the dtype of the answer (a float64
answer to a float32 question is fine), whether a number is a Python float, a 0-d tensor or a
NumPy scalar, the container type of a sequence. ``assert_close`` converts whatever it gets with
``torch.as_tensor`` and compares values; ``dtype=`` and ``types=`` check them when the text asks.

Every failed check raises ``AssertionError`` whose message starts with ``what`` (the case, in the
exercise's words: which input, which property) and says what was expected and what came back.

Where the verdict is decided. In a student's kernel (the self-check, the book) each check judges at
once. When an exercise is graded, :mod:`course_tools.grading.grader.verdicts` runs the same test
code twice, in two processes that never meet: in the sandbox, with the student's answer, each check only
*records* what the answer gave (``actual``, as plain data; the test code runs there with every
``expected`` argument removed); outside, with the instructor's solution, each check records its
``expected`` value and parameters as the *answer key*. The grader then applies the same judges
to the recorded data. ``_session`` is what a check reports to while that happens.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from course_tools.student.judges import JUDGES, as_tensor, class_name, tolerance

__all__ = [
    "assert_close", "assert_equal", "assert_follows_device", "assert_true", "assert_grads_close",
    "assert_raises", "call_unchanged",
    "forbidding", "number", "rng", "to_float64", "tolerance",
]

_session = None  # a graded_run.Session while a graded run records or an answer key is made


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


def assert_equal(actual, expected, what: str, *, types=None, dtype=None) -> None:
    """Exact equality for integers, bools, token ids, shapes and strings (compared as values:
    a list and a tensor with the same entries are equal unless ``types`` says otherwise)."""
    _check("equal", what, actual, expected, types=types, dtype=dtype)


def assert_true(condition, what="") -> None:
    """An observation that must hold (``what``: the message, or a function that makes it when it
    does not). The graders turn a test cell's ``assert`` statements into this check."""
    ok = bool(condition)
    _check("true", (what() if callable(what) else what) if not ok else "", ok, True)


def number(value, what: str) -> float:
    """``value`` as a Python float: accepts a float, an int, a 0-d or one-element tensor or array."""
    if isinstance(value, bool):
        raise AssertionError(f"{what}: expected a number, got a bool")
    t = as_tensor(value, what, "the answer")
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


def assert_raises(error: type[BaseException] | tuple, fn: Callable, *args, what: str, **kwargs) -> None:
    """``fn(*args, **kwargs)`` must raise ``error`` (for exercises whose text asks for it)."""
    try:
        fn(*args, **kwargs)
        raised = None
    except Exception as e:  # noqa: BLE001 (any error is observed; only ``error`` passes)
        raised = {"classes": [class_name(c) for c in type(e).__mro__],
                  "text": f"{type(e).__name__}: {e}"[:300]}
    errors = error if isinstance(error, tuple) else (error,)
    _check("raises", what, raised, [class_name(c) for c in errors])


