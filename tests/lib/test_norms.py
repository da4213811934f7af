"""Tests for course_lib.norms: oracle tests against torch.nn.LayerNorm and torch.nn.RMSNorm.

Weights and biases are randomised (not left at 1 and 0) and copied to the torch module, so a
norm that forgets its gain or bias fails. Forward values and gradients (input, weight, bias)
are compared on several shapes, in fp32 and bf16.
"""

from __future__ import annotations

import pytest
import torch

from course_lib import norms

SHAPES = [(8,), (3, 8), (2, 5, 8), (2, 3, 4, 16)]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _pair(kind: str, D: int, dtype: torch.dtype, bias: bool = True):
    g = torch.Generator().manual_seed(D)
    if kind == "layernorm":
        ours, ref = norms.LayerNorm(D, eps=1e-5, bias=bias), torch.nn.LayerNorm(D, eps=1e-5, bias=bias)
    else:
        ours, ref = norms.RMSNorm(D, eps=1e-6), torch.nn.RMSNorm(D, eps=1e-6)
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        ref.load_state_dict(ours.state_dict())
    return ours.to(dtype), ref.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind,bias", [("layernorm", True), ("layernorm", False), ("rmsnorm", False)])
def test_norm_matches_torch_forward_and_gradients(kind, bias, shape, dtype):
    ours, ref = _pair(kind, shape[-1], dtype, bias)
    x = (3.0 + 2.0 * torch.randn(shape, generator=torch.Generator().manual_seed(1))).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), ref(x2)
    assert y1.dtype == dtype and y1.shape == x.shape
    torch.testing.assert_close(y1.float(), y2.float(), **TOL[dtype])
    grad_out = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    y1.backward(grad_out)
    y2.backward(grad_out)
    torch.testing.assert_close(x1.grad.float(), x2.grad.float(), **TOL[dtype])
    for (name, p1), p2 in zip(ours.named_parameters(), ref.parameters(), strict=True):
        # bf16 parameter grads sum many bf16 products: compare relative to their size
        scale = p2.grad.float().abs().max().clamp(min=1.0)
        torch.testing.assert_close(p1.grad.float() / scale, p2.grad.float() / scale, **TOL[dtype], msg=name)


def test_hand_worked_values_and_biased_variance():
    """x = (1, 2, 3): mean 2, biased variance (1 + 0 + 1) / 3 = 2/3, so y = (x - 2) / sqrt(2/3).
    RMS of (1, 2, 3) is sqrt(14 / 3)."""
    x = torch.tensor([[1.0, 2.0, 3.0]])
    expected = torch.tensor([[-1.0, 0.0, 1.0]]) / (2 / 3 + 1e-5) ** 0.5
    torch.testing.assert_close(norms.LayerNorm(3)(x), expected)
    torch.testing.assert_close(norms.RMSNorm(3)(x), x / (14 / 3 + 1e-6) ** 0.5)


def test_make_norm_and_errors():
    assert isinstance(norms.make_norm("layernorm", 4), norms.LayerNorm)
    assert norms.make_norm("layernorm", 4, bias=False).bias is None
    assert norms.make_norm("rmsnorm", 4, eps=1e-5).eps == 1e-5
    with pytest.raises(ValueError, match="batchnorm"):
        norms.make_norm("batchnorm", 4)
    with pytest.raises(ValueError, match="d_model=4"):
        norms.RMSNorm(4)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="d_model"):
        norms.LayerNorm(0)
