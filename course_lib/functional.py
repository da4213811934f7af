"""Softmax, log-softmax, cross-entropy and the MLP's activations, written out (chapter 03).

The teaching path beside the fast path: each function here is the formula in a few lines of
tensor code, and equals its fused ``torch.nn.functional`` twin (``F.softmax``,
``F.log_softmax``, ``F.cross_entropy``, ``F.gelu``, ``F.silu``); ``tests/lib/test_functional.py``
checks values and gradients. The model (:mod:`course_lib.model`) calls the fused versions.

Shapes: any leading dims ``...``; ``V`` the vocabulary (the class dim, last). Everything is
computed in fp32 (float64 stays float64) and cast back to the input's dtype, as norms and
losses are everywhere in course_lib.

The one trick, numerical stability: ``exp`` overflows fp32 above ~88, so softmax subtracts
the slice's max first (it cancels in the ratio) and log-softmax uses the log-sum-exp form::

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m)          m = max_j x_j
    log_softmax(x)_i = (x_i - m) - log sum_j exp(x_j - m)         every exponent <= 0

Left out: label smoothing, class weights, probability targets, reductions other than the mean.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["softmax", "log_softmax", "cross_entropy", "sigmoid", "gelu", "silu"]


def _upcast(x: Tensor) -> Tensor:
    """``x`` in fp32, or float64 if it already is: bf16's 8 mantissa bits lose sums of exps."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``exp(x_i - m) / sum_j exp(x_j - m)`` along ``dim``, ``m`` the max of the slice; same shape.

    ``-inf`` entries (masked positions) get weight 0. A slice that is *all* ``-inf`` has no
    finite max (``-inf - -inf`` is nan) and comes out all nan, as ``torch.softmax`` gives;
    attention keeps such rows out (see :mod:`course_lib.attention.core`).

    >>> softmax(torch.tensor([0.0, math.log(3)]))    # e^0 : e^{ln 3} = 1 : 3
    tensor([0.2500, 0.7500])
    >>> softmax(torch.tensor([1000.0, 1000.0]))      # exp(1000) overflows; exp(0) does not
    tensor([0.5000, 0.5000])
    """
    xf = _upcast(x)
    m = xf.amax(dim, keepdim=True).detach()  # the shift cancels, so it needs no gradient
    e = torch.exp(xf - m)  # every exponent <= 0, the max's exp is 1
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """``x_i - logsumexp(x)`` along ``dim``, with ``logsumexp(x) = m + log sum_j exp(x_j - m)``.

    Never takes the log of a rounded-to-0 probability: ``log_softmax([0, -1000])`` is
    ``[0, -1000]``, where ``log(softmax(...))`` gives ``-inf``. ``-inf`` entries stay ``-inf``;
    an all ``-inf`` slice is all nan, as ``torch.log_softmax`` gives.

    >>> log_softmax(torch.tensor([0.0, -1000.0]))
    tensor([    0., -1000.])
    """
    xf = _upcast(x)
    m = xf.amax(dim, keepdim=True).detach()
    shifted = xf - m  # (..., V): max 0, so the sum below is >= 1 and its log is finite
    return (shifted - torch.log(torch.exp(shifted).sum(dim, keepdim=True))).to(x.dtype)


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Mean negative log-likelihood of ``targets`` over the *counted* tokens; a 0-d tensor.

    ``logits`` (..., V) float, ``targets`` (...) ``torch.long``: the class dim is last, as a
    GPT's ``(B, S, V)`` logits are (torch's ``F.cross_entropy`` wants it second; it gives the
    same number on ``logits.flatten(0, -2), targets.flatten()``). With ``C`` the tokens whose
    target is not ``ignore_index`` (padding, a prompt)::

        loss = -(1 / |C|) sum_{t in C} log_softmax(logits[t])[targets[t]]

    The mean is over ``C`` only, so padding never dilutes it. If every token is ignored,
    ``|C| = 0`` and the loss is 0 / 0 = nan, as in torch. Returns ``logits``' dtype.

    >>> logits = torch.tensor([[0.0, math.log(3)], [5.0, 1.0]])   # row 0: p = (1/4, 3/4)
    >>> cross_entropy(logits, torch.tensor([1, -100]))             # -log(3/4); row 1 ignored
    tensor(0.2877)
    """
    if not logits.is_floating_point() or logits.dim() < 1:
        raise ValueError(f"logits must be a float tensor (..., V), got {logits.dtype} of shape "
                         f"{tuple(logits.shape)}")
    if targets.dtype != torch.long:
        raise ValueError(f"targets must be class indices of dtype torch.long, got {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must have the shape of logits without its last "
                         f"(class) dim, {tuple(logits.shape[:-1])}; logits are {tuple(logits.shape)}")
    V = logits.shape[-1]
    counted = targets != ignore_index  # (...) bool: the set C
    if ((targets < 0) | (targets >= V))[counted].any():
        raise ValueError(f"targets must be in [0, {V}) or ignore_index={ignore_index}, "
                         f"got values from {targets.min().item()} to {targets.max().item()}")
    logp = log_softmax(_upcast(logits))  # (..., V)
    safe = targets.where(counted, 0)  # (...): any valid index where ignored; masked out below
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # (..., V) -> (...)
    nll = torch.where(counted, nll, 0.0)  # where, not *: an ignored row's -inf logit must not make nan
    return (nll.sum() / counted.sum()).to(logits.dtype)


def sigmoid(x: Tensor) -> Tensor:
    """``1 / (1 + exp(-x))``, written so that no exp overflows for either sign::

        x >= 0:  1 / (1 + exp(-x))              exp(-x) <= 1
        x <  0:  exp(x) / (1 + exp(x))          the same fraction times exp(x) / exp(x); exp(x) < 1

    >>> sigmoid(torch.tensor([-1000.0, 0.0, 1000.0]))
    tensor([0.0000, 0.5000, 1.0000])
    """
    xf = _upcast(x)
    # each branch sees only its own sign (clamped), so the branch not taken is finite too and
    # passes no inf or nan into the gradient
    pos = 1 / (1 + torch.exp(-xf.clamp(min=0)))
    e = torch.exp(xf.clamp(max=0))
    return torch.where(xf >= 0, pos, e / (1 + e)).to(x.dtype)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU (Hendrycks and Gimpel, 2016): ``x * Phi(x)``, ``Phi`` the standard normal CDF.

    * ``"none"``: ``0.5 x (1 + erf(x / sqrt(2)))``, exact (``F.gelu``'s default);
    * ``"tanh"``: ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``, GPT-2's ``gelu_new``,
      within ~1e-3 of exact; the model's MLP uses this one with ``mlp="gelu"`` and the exact one
      with ``mlp="gelu_exact"`` (:class:`course_lib.model.MLP`).

    >>> gelu(torch.tensor([-1.0, 0.0, 1.0]))         # Phi(1) = 0.8413
    tensor([-0.1587,  0.0000,  0.8413])
    """
    xf = _upcast(x)
    if approximate == "none":
        y = 0.5 * xf * (1 + torch.erf(xf / math.sqrt(2)))
    elif approximate == "tanh":
        y = 0.5 * xf * (1 + torch.tanh(math.sqrt(2 / math.pi) * (xf + 0.044715 * xf**3)))
    else:
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return y.to(x.dtype)


def silu(x: Tensor) -> Tensor:
    """SiLU or swish: ``x * sigmoid(x)``, the gate of SwiGLU (Llama's MLP).

    >>> silu(torch.tensor([-1.0, 0.0, 1.0]))
    tensor([-0.2689,  0.0000,  0.7311])
    """
    xf = _upcast(x)
    return (xf * sigmoid(xf)).to(x.dtype)
