"""course_tools.student.checks: the tolerance policy accepts correct float32 answers of any
formulation and rejects wrong ones, checks types only when asked, and says what went wrong."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from course_tools.student import checks


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
    assert checks.tolerance(torch.bfloat16) > checks.tolerance(torch.float16) > \
        checks.tolerance(torch.float32)
    assert checks.tolerance(torch.float32, 100) == pytest.approx(10 * checks.tolerance(torch.float32))
    with pytest.raises(ValueError, match="floating dtype"):
        checks.tolerance(torch.int64)
    with pytest.raises(ValueError, match="at least 1"):
        checks.tolerance(torch.float32, 0)
    x = torch.randn(64, generator=checks.rng(0))
    checks.assert_close(x.bfloat16().softmax(-1), _softmax_reference(x), "bf16", precision=torch.bfloat16,
                        terms=64)
    with pytest.raises(AssertionError):  # the same answer is too coarse for a float32 question
        checks.assert_close(x.bfloat16().softmax(-1), _softmax_reference(x), "bf16", terms=64)


def test_assert_equal_compares_values():
    checks.assert_equal([1, 2, 3], torch.tensor([1, 2, 3]), "ids")
    checks.assert_equal(3, 3, "count")
    checks.assert_equal(torch.tensor(3), 3, "count")
    checks.assert_equal("abc", "abc", "text")
    with pytest.raises(AssertionError, match=r"ids: expected \[1, 2, 3\], got \[1, 5, 3\]; "
                                             r"first difference at index \[1\]"):
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
        checks.call_unchanged(lambda t, mask: mask.fill_(False), x, mask=torch.ones(3, dtype=torch.bool),
                              what="m")


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
    checks.assert_grads_close(lambda a, b: (a @ b).tanh(), lambda a, b: (a @ b).tanh(), [x, w], "tanh(xW)",
                              terms=5)
    with pytest.raises(AssertionError, match="gradient of input 1"):  # the backward of a wrong formula
        checks.assert_grads_close(lambda a, b: a.detach() @ b + (a.sum() - a.sum().detach()),
                                  lambda a, b: a @ b, [x, w], "xW")
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


_X = torch.randn(3, 4, generator=checks.rng(7))
_T = torch.tensor([0, 3, 1])
_W, _B = torch.ones(4), torch.zeros(4)


@pytest.mark.parametrize("ban, answer, called", [
    (F.layer_norm, lambda: torch.ops.aten.native_layer_norm(_X, [4], _W, _B, 1e-5),
     "torch.ops.aten.native_layer_norm (the operator of torch.nn.functional.layer_norm)"),
    (F.layer_norm, lambda: torch.ops.aten.native_layer_norm.default(_X, [4], _W, _B, 1e-5),
     "torch.ops.aten.native_layer_norm.default"),
    (F.layer_norm, lambda: torch.ops.aten.layer_norm(_X, [4], _W, _B), "torch.ops.aten.layer_norm"),
    (F.layer_norm, lambda: torch.layer_norm(_X, (4,), _W, _B), "torch.layer_norm"),
    (F.layer_norm, lambda: torch.native_layer_norm(_X, (4,), _W, _B, 1e-5), "torch.native_layer_norm"),
    (F.layer_norm, lambda: torch.nn.LayerNorm(4)(_X), "torch.nn.functional.layer_norm"),
    (F.rms_norm, lambda: torch.ops.aten.rms_norm(_X, [4], _W), "torch.ops.aten.rms_norm"),
    (F.softmax, lambda: torch.ops.aten._softmax(_X, -1, False), "torch.ops.aten._softmax"),
    (F.softmax, lambda: torch._softmax(_X, -1, False), "torch._softmax"),
    (F.softmax, lambda: _X.softmax(-1), "Tensor.softmax"),
    (F.log_softmax, lambda: torch.ops.aten._log_softmax.default(_X, -1, False),
     "torch.ops.aten._log_softmax.default"),
    (F.log_softmax, lambda: torch.special.log_softmax(_X, -1), "torch._C._special.special_log_softmax"),
    (F.cross_entropy, lambda: torch._C._nn.cross_entropy_loss(_X, _T), "torch._C._nn.cross_entropy_loss"),
    (F.cross_entropy, lambda: torch.ops.aten.cross_entropy_loss(_X, _T), "torch.ops.aten.cross_entropy_loss"),
    (F.nll_loss, lambda: torch._C._nn.nll_loss_nd(_X, _T), "torch._C._nn.nll_loss_nd"),
    (F.nll_loss, lambda: torch.ops.aten.nll_loss_forward(_X, _T, None, 1, -100),
     "torch.ops.aten.nll_loss_forward"),
    (torch.logsumexp, lambda: torch.ops.aten.logsumexp(_X, [-1]), "torch.ops.aten.logsumexp"),
])
def test_forbidding_refuses_the_operators_behind_a_forbidden_function(ban, answer, called):
    """Issue 49: torch.ops.aten.native_layer_norm passed the LayerNorm ban. Every binding of the
    forbidden function's operator, and the aten operator itself, is refused under the ban."""
    with pytest.raises(AssertionError, match=f"by hand: the answer called {re.escape(called)}"):
        with checks.forbidding([ban], "by hand"):
            answer()


@pytest.mark.parametrize("ban", [F.layer_norm, F.log_softmax, torch.logsumexp])
def test_forbidding_sees_the_operator_with_torch_function_modes_switched_off(ban):
    """Only the operators are seen then. (A composite operator such as cross_entropy_loss runs
    as its parts, log_softmax and nll_loss, which a cross-entropy ban allows.)"""
    answer = {F.layer_norm: lambda: torch.layer_norm(_X, (4,)),
              F.log_softmax: lambda: torch.log_softmax(_X, -1),
              torch.logsumexp: lambda: _X.logsumexp(-1)}[ban]
    with pytest.raises(AssertionError, match=r"called torch\.ops\.aten\."):
        with checks.forbidding([ban], "by hand"):
            with torch._C.DisableTorchFunction():
                answer()


@pytest.mark.parametrize("ban, answer", [
    # public functions of their own that run the forbidden function's operator inside
    (F.log_softmax, lambda: F.cross_entropy(_X, _T)),
    (F.softmax, lambda: F.softmin(_X, -1)),
    # the parts of a forbidden composite, each allowed
    (F.cross_entropy, lambda: F.nll_loss(F.log_softmax(_X, -1), _T)),
    (F.cross_entropy,
     lambda: torch.ops.aten.nll_loss_forward(torch.ops.aten._log_softmax(_X, -1, False), _T, None, 1, -100)),
    # other norms and the computation written out share low-level operators with LayerNorm
    (F.layer_norm, lambda: F.group_norm(_X, 1)),
    (F.layer_norm, lambda: F.batch_norm(_X, None, None, training=True)),
    (F.layer_norm, lambda: (_X - _X.mean(-1, keepdim=True))
     * torch.var_mean(_X, -1, correction=0, keepdim=True)[0].add(1e-5).rsqrt()),
    (F.rms_norm, lambda: _X * _X.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt() * _W),
    (F.softmax, lambda: _X.log_softmax(-1).exp()),
    (torch.Tensor.item, lambda: torch.allclose(_X, _X)),
])
def test_forbidding_does_not_refuse_allowed_functions_that_share_operators(ban, answer):
    with checks.forbidding([ban], "by hand"):
        answer()


def _out_made_on_the_cpu(x):
    out = torch.empty(x.shape)  # the CPU, whatever x's device
    out[:] = 2 * x
    return out


def _statistics_filled_on_the_cpu(x):
    mean = torch.zeros(x.shape[-1])  # the CPU: each x[..., d].mean() is copied there
    for d in range(x.shape[-1]):
        mean[d] = x[..., d].mean()
    return x - mean


@pytest.mark.parametrize("answer, called", [
    (lambda x: x + torch.zeros(x.shape[-1]), "aten.add.Tensor"),
    (lambda x: x / torch.tensor([x.shape[-1]]), "aten.div.Tensor"),  # one element, but not 0-d
    (_statistics_filled_on_the_cpu, "aten.copy_"),
    (lambda x: x @ torch.full((4, 1), 0.25), "aten.mm"),  # runs on meta, fails on a GPU
    (lambda x: torch.einsum("ij,...j->...i", torch.eye(4), x), "aten.bmm"),
    (lambda x: torch.where(x > 0, x, torch.zeros(3, 4)), "aten.where"),
    (_out_made_on_the_cpu, "aten.copy_"),
    (lambda x: x.cpu() * 2, "aten._to_copy"),
])
def test_a_tensor_made_on_the_cpu_inside_an_answer_shows_on_the_meta_device(answer, called):
    """Issue 49: tensors made without device= are invisible on a CPU; on meta they show."""
    x = torch.randn(3, 4, generator=checks.rng(1))
    with pytest.raises(AssertionError, match=f"layer 1: .* the CPU, in torch.ops.{re.escape(called)}"):
        checks.assert_follows_device(answer, x, what="layer 1")


def test_answers_that_follow_their_input_s_device_pass_on_meta():
    x = torch.randn(3, 4, generator=checks.rng(1))
    lin = torch.nn.Linear(4, 2)
    for answer in (lambda x: (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True),
                   lambda x: x * torch.tensor(2.0),  # a 0-d CPU tensor mixes with any device
                   lambda x: x[torch.arange(2)],  # CPU indices index a tensor of any device
                   lambda x: x + torch.zeros(4, device=x.device) + torch.zeros(4).to(x.device),
                   lambda x: torch.stack([row / row.norm() for row in x]),
                   lambda x: x.double()):  # the same dtype on meta as on the CPU
        out = checks.assert_follows_device(answer, x, what="f")
        assert out.device.type == "cpu"  # the CPU result comes back
    checks.assert_follows_device(lambda x, m: m(x), x, lin, what="a module argument")  # goes to meta too

    def needs_values(x):  # cannot run on meta: the case says nothing
        return x * 2 if bool((x < 100).all()) else x + torch.zeros(4)
    checks.assert_follows_device(needs_values, x, what="f")
    with pytest.raises(AssertionError, match="returned shape"):
        checks.assert_follows_device(lambda x: x.sum() if x.device.type == "meta" else x, x, what="f")
