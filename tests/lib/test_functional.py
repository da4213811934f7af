"""Tests for course_lib.functional: oracle tests against torch.nn.functional.

Values and gradients are compared with ``F.softmax``, ``F.log_softmax``, ``F.cross_entropy``,
``F.gelu`` and ``F.silu`` on several shapes and dims, in float32 (1e-6), float64 (1e-12) and
bf16 (1e-2: 8 mantissa bits); at extreme logits (+-1e4, -inf, fully masked rows); at the edges
(V = 1, an empty batch, every token ignored). ``torch.autograd.gradcheck`` checks the
gradients against finite differences in float64. Bad inputs name what was expected.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from course_lib import functional as Fn

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
TOL = {torch.float32: dict(atol=1e-6, rtol=1e-6), torch.float64: dict(atol=1e-12, rtol=1e-12),
       torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}
NEG_INF = float("-inf")


def _randn(*shape, dtype=torch.float32, scale=3.0, seed=0):
    return (scale * torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            ).to(dtype)


def _same_grads(ours, ref, x, dtype, seed=1):
    """Backpropagate the same random output gradient through both; compare the input gradients."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), ref(x2)
    g = _randn(*y2.shape, dtype=dtype, scale=1.0, seed=seed)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, **TOL[dtype], equal_nan=True)


# --------------------------------------------------------------------------- softmax, log-softmax
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, dim", [((7,), -1), ((3, 5), -1), ((3, 5), 0), ((2, 3, 11), 1),
                                        ((2, 3, 11), -1), ((0, 5), -1), ((4, 1), -1)])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_and_log_softmax_match_torch(name, shape, dim, dtype):
    ours, ref = getattr(Fn, name), getattr(F, name)
    x = _randn(*shape, dtype=dtype)
    y = ours(x, dim)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, ref(x, dim), **TOL[dtype])
    _same_grads(lambda t: ours(t, dim), lambda t: ref(t, dim), x, dtype)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_extreme_and_masked_logits_match_torch(name):
    """+-1e4 overflows a naive exp; -inf entries are masked positions; the last row is fully
    masked and gives nan in both (stated in the docstring)."""
    ours, ref = getattr(Fn, name), getattr(F, name)
    x = torch.tensor([[1e4, 0.0, -1e4],
                      [1e4, 1e4, 1e4],
                      [-1e4, -1e4 + 1.0, NEG_INF],
                      [0.0, NEG_INF, NEG_INF],
                      [NEG_INF, NEG_INF, NEG_INF]])  # fmt: skip
    y = ours(x, -1)
    torch.testing.assert_close(y, ref(x, -1), atol=1e-6, rtol=1e-6, equal_nan=True)
    assert torch.isfinite(y[:2]).all()                 # no overflow at 1e4
    assert y[4].isnan().all()                          # a fully masked row: nan, as torch
    if name == "softmax":
        assert y[3].tolist() == [1.0, 0.0, 0.0]        # masked positions get exactly 0
        torch.testing.assert_close(y[2, :2], torch.tensor([1.0, math.e]) / (1 + math.e))
    else:
        assert y[3].tolist() == [0.0, NEG_INF, NEG_INF]
    _same_grads(lambda t: ours(t, -1)[:4].nan_to_num(neginf=0.0),
                lambda t: ref(t, -1)[:4].nan_to_num(neginf=0.0), x, torch.float32)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_gradcheck(name):
    fn = getattr(Fn, name)
    x = _randn(3, 4, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: fn(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: fn(t, 0), (x,))


# --------------------------------------------------------------------------- cross-entropy
def _torch_ce(logits, targets, ignore_index=-100):
    """torch wants the class dim second; flattening the leading dims gives the same mean."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten(), ignore_index=ignore_index)


def _targets(shape, V, seed=0, ignore_every=0, ignore_index=-100):
    t = torch.randint(V, shape, generator=torch.Generator().manual_seed(seed))
    if ignore_every:
        t.view(-1)[::ignore_every] = ignore_index
    return t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, V, ignore_every", [((6,), 5, 0), ((6,), 5, 2), ((2, 7), 11, 3),
                                                     ((2, 3, 4), 9, 5), ((5,), 1, 0), ((0,), 5, 0)])
def test_cross_entropy_matches_torch(shape, V, ignore_every, dtype):
    logits = _randn(*shape, V, dtype=dtype)
    targets = _targets(shape, V, ignore_every=ignore_every)
    loss = Fn.cross_entropy(logits, targets)
    assert loss.shape == () and loss.dtype == dtype
    torch.testing.assert_close(loss, _torch_ce(logits, targets), **TOL[dtype], equal_nan=True)
    if logits.numel():
        _same_grads(lambda t: Fn.cross_entropy(t, targets), lambda t: _torch_ce(t, targets), logits, dtype)


def test_cross_entropy_hand_worked_and_mean_over_counted_tokens():
    """Uniform logits over V classes cost log V per token. Ignored tokens neither add to the
    sum nor to the count: ignoring a token with a huge loss leaves the mean of the others."""
    V = 8
    uniform = Fn.cross_entropy(torch.zeros(4, V), torch.tensor([0, 3, 5, 7]))
    assert uniform.item() == pytest.approx(math.log(V))
    logits = torch.tensor([[0.0, math.log(3)], [0.0, 0.0], [50.0, 0.0]])
    expected = (-math.log(3 / 4) + math.log(2)) / 2              # rows 0 and 1 only
    assert Fn.cross_entropy(logits, torch.tensor([1, 0, -100])).item() == pytest.approx(expected)
    assert Fn.cross_entropy(logits, torch.tensor([1, 0, 1])).item() == pytest.approx(
        (-math.log(3 / 4) + math.log(2) + 50) / 3, rel=1e-6)     # the third row costs ~50 when counted
    custom = Fn.cross_entropy(logits, torch.tensor([1, 0, 1]), ignore_index=1)  # only row 1 counts
    assert custom.item() == pytest.approx(math.log(2))


def test_cross_entropy_extreme_logits_and_masked_classes():
    """Logits at +-1e4 stay finite; a -inf logit (a masked class) is fine unless it is the
    target (infinite loss, as torch); an ignored row may hold -inf anywhere without making nan."""
    logits = torch.tensor([[1e4, -1e4, 0.0], [-1e4, -1e4, 1e4], [0.0, NEG_INF, 1.0], [NEG_INF, 0.0, 0.0]])
    targets = torch.tensor([0, 1, 2, -100])
    loss = Fn.cross_entropy(logits, targets)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, _torch_ce(logits, targets))
    _same_grads(lambda t: Fn.cross_entropy(t, targets), lambda t: _torch_ce(t, targets), logits,
                torch.float32)
    assert Fn.cross_entropy(logits[2:3], torch.tensor([1])).item() == math.inf == _torch_ce(
        logits[2:3], torch.tensor([1])).item()


def test_cross_entropy_all_ignored_is_nan_as_torch():
    logits = _randn(2, 3, 5).requires_grad_()
    targets = torch.full((2, 3), -100)
    loss = Fn.cross_entropy(logits, targets)
    assert loss.isnan() and _torch_ce(logits, targets).isnan()
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))   # nothing counted, nothing learned
    ref_logits = logits.detach().clone().requires_grad_()
    _torch_ce(ref_logits, targets).backward()
    assert torch.equal(ref_logits.grad, logits.grad)           # as torch


def test_cross_entropy_gradcheck():
    logits = _randn(2, 3, 4, dtype=torch.float64).requires_grad_()
    targets = torch.tensor([[0, 3, -100], [2, 1, 1]])
    assert torch.autograd.gradcheck(lambda t: Fn.cross_entropy(t, targets), (logits,))


@pytest.mark.parametrize("logits, targets, match", [
    (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), "shape of logits without"),
    (torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long), "shape of logits without"),
    (torch.zeros(2, 5), torch.zeros(2), "torch.long"),
    (torch.zeros(2, 5), torch.zeros(2, dtype=torch.int32), "torch.long"),
    (torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, dtype=torch.long), "float"),
    (torch.zeros(2, 5), torch.tensor([0, 5]), r"\[0, 5\)"),
    (torch.zeros(2, 5), torch.tensor([0, -1]), r"\[0, 5\)"),
])  # fmt: skip
def test_cross_entropy_bad_inputs_say_what_was_expected(logits, targets, match):
    with pytest.raises(ValueError, match=match):
        Fn.cross_entropy(logits, targets)


# --------------------------------------------------------------------------- activations
ACTIVATIONS = {
    "gelu": (Fn.gelu, F.gelu),
    "gelu_tanh": (lambda x: Fn.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
    "silu": (Fn.silu, F.silu),
    "sigmoid": (Fn.sigmoid, torch.sigmoid),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(9,), (3, 4), (2, 3, 5), (0, 4)])
@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activations_match_torch(name, shape, dtype):
    ours, ref = ACTIVATIONS[name]
    x = _randn(*shape, dtype=dtype)
    y = ours(x)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y, ref(x), **TOL[dtype])
    _same_grads(ours, ref, x, dtype)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activations_at_extreme_inputs(name):
    """1e4 and -1e4 overflow exp(-x) in a naive sigmoid; values and gradients stay finite."""
    ours, ref = ACTIVATIONS[name]
    x = torch.tensor([-1e4, -100.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 100.0, 1e4])
    y = ours(x)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref(x), atol=1e-6, rtol=1e-6)
    _same_grads(ours, ref, x, torch.float32)


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activations_gradcheck(name):
    ours, _ = ACTIVATIONS[name]
    assert torch.autograd.gradcheck(ours, (_randn(3, 4, dtype=torch.float64).requires_grad_(),))


def test_gelu_tanh_is_close_to_exact_and_bad_mode_is_named():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert (Fn.gelu(x, "tanh") - Fn.gelu(x)).abs().max() < 1e-3   # the docstring's claim
    with pytest.raises(ValueError, match="approximate"):
        Fn.gelu(x, approximate="erf")
