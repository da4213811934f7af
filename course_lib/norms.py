"""Normalization layers from scratch: LayerNorm and RMSNorm (chapter 04; used from chapter 03).

Shapes: ``D`` model width; any leading dims ``(..., D)`` are normalised independently.

* :class:`LayerNorm` (Ba et al., 2016): centre and scale each vector over its last dim, then
  apply a learned gain (and bias)::

      y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias

* :class:`RMSNorm` (Zhang & Sennrich, 2019; Llama): no centring, no bias, divide by the root
  mean square::

      y = x / sqrt(mean(x^2) + eps) * weight

Both use the *biased* variance (divide by D, not D - 1), as ``torch.nn.LayerNorm`` does, and
both compute in fp32 and cast the result back to the input's dtype (a bf16 mean of squares
loses too much). Tests check them against ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm``,
forward and gradients. Left out: fused kernels, QK-norm, DyT and other norm-free variants.

>>> x = torch.tensor([[1.0, 2.0, 3.0]])
>>> LayerNorm(3)(x).detach()   # mean 2, biased variance 2/3
tensor([[-1.2247,  0.0000,  1.2247]])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LayerNorm", "RMSNorm", "make_norm", "NORMS"]

NORMS = ("layernorm", "rmsnorm")


class LayerNorm(nn.Module):
    """LayerNorm over the last dim, biased variance, computed in fp32 (chapter 04).

    ``bias=False`` drops the additive term (some models, e.g. OLMo, do without it).
    Equal to ``torch.nn.LayerNorm(d_model, eps, bias=bias)``.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        if d_model < 1 or eps < 0:
            raise ValueError(f"need d_model >= 1 and eps >= 0, got d_model={d_model}, eps={eps}")
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gain, starts at 1
        self.bias = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x's last dim must be d_model={self.d_model}, got shape {tuple(x.shape)}")
        xf = x.float()
        mean = xf.mean(dim=-1, keepdim=True)  # (..., D) -> (..., 1)
        var = (xf - mean).pow(2).mean(dim=-1, keepdim=True)  # biased: divide by D
        y = (xf - mean) * torch.rsqrt(var + self.eps) * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, computed in fp32 (chapter 04).

    ``mean(x^2)`` is the biased second moment (divide by D). Equal to
    ``torch.nn.RMSNorm(d_model, eps)`` and to HuggingFace's ``LlamaRMSNorm``.
    """

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        if d_model < 1 or eps < 0:
            raise ValueError(f"need d_model >= 1 and eps >= 0, got d_model={d_model}, eps={eps}")
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x's last dim must be d_model={self.d_model}, got shape {tuple(x.shape)}")
        xf = x.float()
        rms_inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., D) -> (..., 1)
        return (xf * rms_inv * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.d_model}, eps={self.eps}"


def make_norm(kind: str, d_model: int, *, eps: float | None = None, bias: bool = True) -> nn.Module:
    """``"layernorm"`` -> :class:`LayerNorm`, ``"rmsnorm"`` -> :class:`RMSNorm`.

    ``eps=None`` keeps each class's default (1e-5 LayerNorm, as GPT-2; 1e-6 RMSNorm, as
    Llama); ``bias`` applies to LayerNorm only (RMSNorm has none).

    >>> make_norm("rmsnorm", 8)
    RMSNorm(8, eps=1e-06)
    """
    if kind == "layernorm":
        return LayerNorm(d_model, bias=bias) if eps is None else LayerNorm(d_model, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(d_model) if eps is None else RMSNorm(d_model, eps)
    raise ValueError(f"norm must be one of {NORMS}, got {kind!r}")
