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
number of the format) so that a value that legitimately underflows to 0 is not an error. For float32 and ``n = 1`` that is ``3.8e-6``; for
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
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "assert_close", "assert_equal", "assert_grads_close", "assert_raises", "call_unchanged",
    "number", "rng", "to_float64", "tolerance",
]

# Unit roundoff (half the machine epsilon) of each floating-point format.
_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SAFETY = 64  # chained operations and u * n growth of short sums, on any kernel or thread count


def rng(seed: int) -> torch.Generator:
    """A local CPU generator: ``torch.randn(..., generator=rng(0))`` gives the same inputs whatever ran before."""
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
    _check_type(actual, what, types, dtype)
    if isinstance(expected, (str, bytes)) or isinstance(actual, (str, bytes)):
        if actual != expected:
            raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")
        return
    if isinstance(expected, (int, float, bool)) and not isinstance(actual, torch.Tensor) and not hasattr(actual, "shape"):
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
    for key, tensor, copy_ in before:
        name = f"argument {key + 1}" if isinstance(key, int) else f"argument {key!r}"
        if tensor.shape != copy_.shape or not torch.equal(tensor.detach(), copy_):
            raise AssertionError(f"{what}: the function changed its {name} in place; "
                                 "it must leave its inputs as they were")
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
    got = _grads(answer, inputs, seed, what)
    want = _grads(reference, [to_float64(x) for x in inputs], seed, f"{what} (the reference)")
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if w.grad is None:
            continue
        if g.grad is None:
            raise AssertionError(f"{what}: no gradient reached input {i + 1}; the reference has one "
                                 "(is the computation detached, or done outside autograd?)")
        assert_close(g.grad, w.grad, f"{what}, gradient of input {i + 1}", precision=precision, terms=terms)


def assert_raises(error: type[BaseException] | tuple, fn: Callable, *args, what: str, **kwargs) -> None:
    """``fn(*args, **kwargs)`` must raise ``error`` (for exercises whose text asks for it)."""
    names = error.__name__ if isinstance(error, type) else " or ".join(e.__name__ for e in error)
    try:
        fn(*args, **kwargs)
    except error:
        return
    except Exception as e:  # noqa: BLE001 (any other error is the wrong one)
        raise AssertionError(f"{what}: expected {names}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"{what}: expected {names}, but the call returned normally")
