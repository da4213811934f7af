"""course_lib.grading.checks: the tolerance policy accepts correct float32 answers of any
formulation and rejects wrong ones, checks types only when asked, and says what went wrong."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from course_lib.grading import checks


def _softmax_reference(x):
    return torch.softmax(checks.to_float64(x), dim=-1)


@pytest.mark.parametrize("V", [5, 1000, 50_000])
def test_float32_softmax_in_any_formulation_passes(V):
    x = 4 * torch.randn(3, V, generator=checks.rng(V))
    want = _softmax_reference(x)
    e = (x - x.max(-1, keepdim=True).values).exp()
    for answer in (torch.softmax(x, -1), e / e.sum(-1, keepdim=True),
                   torch.exp(x - torch.logsumexp(x, -1, keepdim=True)), torch.softmax(x.double(), -1)):
        checks.assert_close(answer, want, "softmax", terms=V)


@pytest.mark.parametrize("D", [8, 512, 4096])
def test_float32_matmul_in_any_order_passes_and_a_small_slip_fails(D):
    g = checks.rng(D)
    a, b = torch.randn(16, D, generator=g), torch.randn(D, 8, generator=g)
    want = checks.to_float64(a) @ checks.to_float64(b)
    for answer in (a @ b, torch.einsum("id,dj->ij", a, b), (a[:, :, None] * b[None]).sum(1),
                   (a.T.flip(0).T @ b.flip(0))):
        checks.assert_close(answer, want, "a @ b", terms=D)
    with pytest.raises(AssertionError, match="a @ b"):
        checks.assert_close(a @ b * (1 + 1e-3), want, "a @ b", terms=D)
    with pytest.raises(AssertionError):
        checks.assert_close(a @ b / D**0.5, want, "a @ b", terms=D)


def test_cancellation_is_judged_against_the_size_of_the_terms():
    x = torch.tensor([1e4, 1.0, -1e4])
    exact = torch.tensor(1.0, dtype=torch.float64)
    # float32 summation of these terms loses the small one's low bits, not its value
    checks.assert_close(x.sum(), exact, "sum", scale=1e4, terms=3)
    with pytest.raises(AssertionError):
        checks.assert_close(torch.tensor(1.01), exact, "sum")


def test_types_are_free_unless_asked():
    want = torch.tensor(2.5, dtype=torch.float64)
    for answer in (2.5, torch.tensor(2.5), torch.tensor(2.5, dtype=torch.float64), np.float32(2.5), [2.5][0]):
        checks.assert_close(answer, want, "scalar")
    checks.assert_close([[1.0, 2.0]], torch.tensor([[1.0, 2.0]], dtype=torch.float64), "list")
    with pytest.raises(AssertionError, match="expected dtype torch.float32"):
        checks.assert_close(torch.tensor(2.5, dtype=torch.float64), want, "scalar", dtype=torch.float32)
    with pytest.raises(AssertionError, match="expected type float, got Tensor"):
        checks.assert_close(torch.tensor(2.5), want, "scalar", types=float)
    with pytest.raises(AssertionError, match="number or an array"):
        checks.assert_close("2.5x", want, "scalar")


def test_infinities_nan_and_shapes():
    want = torch.tensor([0.5, float("-inf"), 1.0], dtype=torch.float64)
    checks.assert_close(torch.tensor([0.5, float("-inf"), 1.0]), want, "masked")
    with pytest.raises(AssertionError, match=r"masked: expected -inf at index \[1\], got -1e\+09"):
        checks.assert_close(torch.tensor([0.5, -1e9, 1.0]), want, "masked")
    with pytest.raises(AssertionError, match="expected 1 at index"):
        checks.assert_close(torch.tensor([0.5, float("-inf"), float("nan")]), want, "masked")
    nan = torch.tensor([float("nan")], dtype=torch.float64)
    with pytest.raises(AssertionError):
        checks.assert_close(torch.tensor([float("nan")]), nan, "nan")
    checks.assert_close(torch.tensor([float("nan")]), nan, "nan", equal_nan=True)
    with pytest.raises(AssertionError, match=r"expected shape \(3,\), got shape \(1, 3\)"):
        checks.assert_close(torch.zeros(1, 3), torch.zeros(3), "shape")


def test_message_names_the_case_the_values_and_the_count():
    want = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    got = want.float().clone()
    got[1, 2] = 7.0
    with pytest.raises(AssertionError) as e:
        checks.assert_close(got, want, "scores of head 2 with a padded key")
    text = str(e.value)
    assert text.startswith("scores of head 2 with a padded key: expected 5 at index [1, 2], got 7")
    assert "(1 of 6 values off)" in text


def test_tolerance_follows_the_format_and_the_length_of_the_sums():
    assert checks.tolerance(torch.bfloat16) > checks.tolerance(torch.float16) > checks.tolerance(torch.float32)
    assert checks.tolerance(torch.float32, 100) == pytest.approx(10 * checks.tolerance(torch.float32))
    with pytest.raises(ValueError, match="floating dtype"):
        checks.tolerance(torch.int64)
    with pytest.raises(ValueError, match="at least 1"):
        checks.tolerance(torch.float32, 0)
    x = torch.randn(64, generator=checks.rng(0))
    checks.assert_close(x.bfloat16().softmax(-1), _softmax_reference(x), "bf16", precision=torch.bfloat16, terms=64)
    with pytest.raises(AssertionError):  # the same answer is too coarse for a float32 question
        checks.assert_close(x.bfloat16().softmax(-1), _softmax_reference(x), "bf16", terms=64)


def test_assert_equal_compares_values():
    checks.assert_equal([1, 2, 3], torch.tensor([1, 2, 3]), "ids")
    checks.assert_equal(3, 3, "count")
    checks.assert_equal(torch.tensor(3), 3, "count")
    checks.assert_equal("abc", "abc", "text")
    with pytest.raises(AssertionError, match=r"ids: expected \[1, 2, 3\], got \[1, 5, 3\]; first difference at index \[1\]"):
        checks.assert_equal([1, 5, 3], torch.tensor([1, 2, 3]), "ids")
    with pytest.raises(AssertionError, match="expected shape"):
        checks.assert_equal([1, 2], [1, 2, 3], "ids")
    with pytest.raises(AssertionError, match="count: expected 4, got 3"):
        checks.assert_equal(3, 4, "count")
    with pytest.raises(AssertionError, match="expected type list"):
        checks.assert_equal((1, 2), [1, 2], "ids", types=list)


def test_python_floats_keep_their_float64_precision():
    checks.assert_close(1 + 1e-12, torch.tensor(1 + 1e-12, dtype=torch.float64), "x", precision=torch.float64)
    with pytest.raises(AssertionError):
        checks.assert_close(1 + 1e-8, torch.tensor(1.0, dtype=torch.float64), "x", precision=torch.float64)
    assert checks.number(1 + 1e-12, "x") == 1 + 1e-12


def test_number_reads_any_scalar():
    for x in (1.5, torch.tensor(1.5), torch.tensor([1.5]), np.float64(1.5), np.array(1.5)):
        assert checks.number(x, "loss") == 1.5
    with pytest.raises(AssertionError, match="single number, got shape"):
        checks.number(torch.ones(2), "loss")
    with pytest.raises(AssertionError, match="got a bool"):
        checks.number(True, "loss")


def test_call_unchanged_catches_an_in_place_answer():
    x = torch.randn(4, generator=checks.rng(1))
    assert checks.call_unchanged(lambda t: t * 2, x, what="double").equal(x * 2)
    with pytest.raises(AssertionError, match="changed its argument 1 in place"):
        checks.call_unchanged(lambda t: t.mul_(2), x, what="double")
    with pytest.raises(AssertionError, match="argument 'mask'"):
        checks.call_unchanged(lambda t, mask: mask.fill_(False), x, mask=torch.ones(3, dtype=torch.bool), what="m")


_LOGSUMEXP = torch.logsumexp  # an alias made before the check, as an answer cell might


def _clip(x):
    p = torch.nn.Parameter(x.clone())
    p.grad = x.clone()
    from torch.nn.utils import clip_grad_norm_ as renamed
    return renamed([p], 1.0)


def _swallowed(x):
    try:
        return torch.nn.functional.log_softmax(x, -1)
    except Exception:
        return None


@pytest.mark.parametrize("answer, called", [
    (lambda x: _LOGSUMEXP(x, -1), "torch.logsumexp"),
    (lambda x: x.logsumexp(-1), "Tensor.logsumexp"),
    (lambda x: torch.nn.functional.cross_entropy(x, torch.zeros(3, dtype=torch.long)),
     "torch.nn.functional.cross_entropy"),
    (_clip, "torch.nn.utils.clip_grad.clip_grad_norm_"),
    (_swallowed, "torch.nn.functional.log_softmax"),
])
def test_forbidding_sees_a_call_however_it_is_named(answer, called):
    forbidden = [torch.logsumexp, torch.Tensor.logsumexp, torch.nn.functional.log_softmax,
                 torch.nn.functional.cross_entropy, torch.nn.utils.clip_grad_norm_]
    x = torch.randn(3, 4, generator=checks.rng(0))
    with pytest.raises(AssertionError, match=f"log-sum-exp by hand: the answer called {called}, "):
        with checks.forbidding(forbidden, "log-sum-exp by hand"):
            answer(x)
    with checks.forbidding(forbidden, "log-sum-exp by hand"):  # the same computation written out passes
        m = x.max(-1, keepdim=True).values
        ((x - m).exp().sum(-1, keepdim=True).log() + m).squeeze(-1)
    assert sys.getprofile() is None


def test_forbidding_a_decorated_function_does_not_forbid_its_decorator():
    @torch.no_grad()
    def own_clip(params, max_norm):  # a student's, decorated like torch's clip_grad_norm_
        return max_norm

    with checks.forbidding([torch.nn.utils.clip_grad_norm_], "clip by hand"):
        own_clip([], 1.0)
    with pytest.raises(AssertionError, match="clip_grad_norm_"):
        with checks.forbidding([torch.nn.utils.clip_grad_norm_], "clip by hand"):
            torch.nn.utils.clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0)


def test_gradients_by_value():
    x = torch.randn(3, 5, generator=checks.rng(2))
    w = torch.randn(5, 4, generator=checks.rng(3))
    checks.assert_grads_close(lambda a, b: (a @ b).tanh(), lambda a, b: (a @ b).tanh(), [x, w], "tanh(xW)", terms=5)
    with pytest.raises(AssertionError, match="gradient of input 1"):  # the backward of a wrong formula
        checks.assert_grads_close(lambda a, b: a.detach() @ b + (a.sum() - a.sum().detach()), lambda a, b: a @ b,
                                  [x, w], "xW")
    with pytest.raises(AssertionError, match="carries no gradient"):
        checks.assert_grads_close(lambda a, b: (a @ b).detach(), lambda a, b: a @ b, [x, w], "xW")
    with pytest.raises(AssertionError, match="no gradient reached input 2"):
        checks.assert_grads_close(lambda a, b: a @ b.detach(), lambda a, b: a @ b, [x, w], "xW")
    # a float32 gradient that underflows to 0 where float64's is tiny is right
    tiny = torch.tensor([-200.0])
    checks.assert_grads_close(torch.sigmoid, torch.sigmoid, [tiny], "sigmoid far left")


def test_assert_raises():
    checks.assert_raises(ValueError, int, "x", what="parse")
    with pytest.raises(AssertionError, match="expected ValueError, but the call returned normally"):
        checks.assert_raises(ValueError, int, "3", what="parse")
    with pytest.raises(AssertionError, match="expected ValueError, got TypeError"):
        checks.assert_raises(ValueError, int, None, what="parse")


def test_float64_copies_leave_the_originals_alone():
    lin = torch.nn.Linear(3, 2)
    copies = checks.to_float64({"m": lin, "xs": [torch.ones(2), torch.arange(3)], "n": 4})
    assert copies["m"].weight.dtype == torch.float64 and lin.weight.dtype == torch.float32
    assert copies["xs"][0].dtype == torch.float64 and copies["xs"][1].dtype == torch.int64
    assert copies["n"] == 4
    a = torch.randn(2, generator=checks.rng(5))
    assert torch.equal(a, torch.randn(2, generator=checks.rng(5)))


def test_torch_compile_runs_as_written_inside_forbidding_and_its_calls_are_seen():
    """Dynamo cannot trace under forbidding's profile hook and torch-function mode; the compiled
    function runs eagerly there instead, so an answer using torch.compile works, and what it calls
    is watched like any other call."""
    def answer(x):
        return torch.compile(lambda t: t.softmax(-1))(x)

    x = torch.randn(3)
    with checks.forbidding([torch.nn.utils.clip_grad_norm_], "no clipping"):
        out = answer(x)
    torch.testing.assert_close(out, x.softmax(-1))
    with pytest.raises(AssertionError, match="called Tensor.softmax"):
        with checks.forbidding([torch.Tensor.softmax], "no softmax"):
            answer(x)
