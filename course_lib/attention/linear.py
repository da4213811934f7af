"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs") (chapter 02).

Replace the softmax kernel exp(q.k) by a feature map product phi(q).phi(k), with
``phi(x) = elu(x) + 1 > 0``. Then the row-normalised weights factor and the sum can be
reordered (shapes: S queries, Sk keys, Dh key dim, Dv value dim)::

    out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)
          = phi(q_i) [sum_j phi(k_j) v_j^T] / phi(q_i) [sum_j phi(k_j)]
                     '-- (Dh, Dv), once --'          '-- (Dh,), once --'

so the cost is O(S Dh Dv) instead of O(S Sk Dh). Causal: the bracketed sums become prefix
sums over j <= i (an RNN whose state is the (Dh, Dv) matrix). This module computes the
prefix sums with ``cumsum`` over a (S, Dh, Dv) tensor: simple, but O(S Dh Dv) memory; the
paper's kernel (and a recurrent loop) keep only one state.

:func:`linear_attention_quadratic` is the same maths the slow way, ``(phi(Q) phi(K)^T,
masked, row-normalised) @ V``, for tests and teaching. Both compute in fp32 and cast back.
Left out: other feature maps (Performer's random features), gating and decay (RetNet, Mamba).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_attention", "linear_attention_quadratic", "elu_feature_map"]


def elu_feature_map(x: Tensor) -> Tensor:
    """``phi(x) = elu(x) + 1``, positive everywhere (Katharopoulos et al., 2020)."""
    return F.elu(x) + 1


def _prepare(q: Tensor, k: Tensor, v: Tensor, causal: bool, feature_map):
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or q.dim() < 2:
        raise ValueError(f"need q (..., S, Dh), k (..., Sk, Dh), v (..., Sk, Dv), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"causal linear attention needs S == Sk, got S={q.shape[-2]}, Sk={k.shape[-2]}")
    phi = elu_feature_map if feature_map is None else feature_map
    return phi(q.float()), phi(k.float()), v.float()


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, feature_map=None,
                     eps: float = 1e-6) -> Tensor:
    """Linear attention in O(S): q (..., S, Dh), k (..., Sk, Dh), v (..., Sk, Dv) -> (..., S, Dv).

    Naive equivalent: :func:`linear_attention_quadratic` (same arguments).

    >>> q = k = torch.zeros(1, 2, 3); v = torch.tensor([[[1.0], [3.0]]])
    >>> linear_attention(q, k, v), linear_attention(q, k, v, causal=True)   # equal weights
    (tensor([[[2.0000],
             [2.0000]]]), tensor([[[1.0000],
             [2.0000]]]))
    """
    fq, fk, fv = _prepare(q, k, v, causal, feature_map)
    if not causal:
        kv = torch.einsum("...jd,...je->...de", fk, fv)  # (..., Sk, Dh), (..., Sk, Dv) -> (..., Dh, Dv)
        z = fk.sum(-2)  # (..., Sk, Dh) -> (..., Dh)
        num = torch.einsum("...id,...de->...ie", fq, kv)  # (..., S, Dh), (..., Dh, Dv) -> (..., S, Dv)
        den = torch.einsum("...id,...d->...i", fq, z)  # (..., S, Dh), (..., Dh) -> (..., S)
    else:
        outer = fk[..., :, None] * fv[..., None, :]  # (.., S, Dh, 1) * (.., S, 1, Dv) -> (.., S, Dh, Dv)
        kv = torch.cumsum(outer, dim=-3)  # (..., S, Dh, Dv) prefix sums over positions
        z = torch.cumsum(fk, dim=-2)  # (..., S, Dh) prefix sums
        num = torch.einsum("...id,...ide->...ie", fq, kv)  # (..., S, Dh), (..., S, Dh, Dv) -> (..., S, Dv)
        den = (fq * z).sum(-1)  # (..., S, Dh) -> (..., S)
    return (num / (den[..., None] + eps)).to(v.dtype)  # (..., S, Dv)


def linear_attention_quadratic(q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, feature_map=None,
                               eps: float = 1e-6) -> Tensor:
    """The same as :func:`linear_attention`, written as an (S, Sk) weight matrix: O(S Sk)."""
    fq, fk, fv = _prepare(q, k, v, causal, feature_map)
    scores = fq @ fk.transpose(-2, -1)  # (..., S, Dh) @ (..., Dh, Sk) -> (..., S, Sk)
    if causal:
        S = scores.shape[-1]
        scores = scores * torch.ones(S, S, dtype=torch.bool, device=scores.device).tril()  # zero the future
    weights = scores / (scores.sum(-1, keepdim=True) + eps)  # row-normalised, (..., S, Sk)
    return (weights @ fv).to(v.dtype)  # (..., S, Sk) @ (..., Sk, Dv) -> (..., S, Dv)
