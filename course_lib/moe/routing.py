"""Routing tokens to experts: top-K choice, expert capacity, and the two router losses (chapter 07).

Shapes: ``T`` tokens (batch and positions flattened), ``E`` experts, ``K`` experts per token.

Everything here is a pure function of the router's logits ``(T, E)``::

    logits (T, E) --softmax--> probs (T, E) --top-K--> experts (T, K), gates (T, K)
                                                  \\--capacity--> kept (T, K)

*Capacity.* Each expert has ``C = ceil(capacity_factor * K * T / E)`` slots per batch (Switch
Transformer, Fedus et al., 2022; GShard, Lepikhin et al., 2021): a perfectly balanced router
fills every expert to ``K T / E``, and the factor leaves room for imbalance. Slots go first
come, first served, *choice-major* as in GShard: every token's first choice is seated before
any token's second choice, and within a choice tokens go in order. A choice that finds its
expert full is dropped; the token then gets nothing from that expert and, if all its choices
are dropped, passes through the layer on the residual stream alone::

    first choices:   t0->e1  t1->e0  t2->e1  t3->e1         E = 3, K = 2, C = 2 slots each
    second choices:  t0->e0  t1->e2  t2->e2  t3->e0

    e0: t1, t0   full, so t3's second choice is dropped
    e1: t0, t2   full, so t3's first choice is dropped
    e2: t1, t2   t3 lost both choices and rides the residual stream alone

*Losses.* The load-balancing loss (Switch, eq. 4-6) is ``E * sum_e f_e P_e``, with ``f_e`` the
fraction of tokens whose top-K choices include ``e`` (before capacity) and ``P_e`` the mean
router probability of ``e``; it is 1 per choice (K in all) when both are uniform, and larger
when the router favours experts it already sends tokens to. ``f`` has no gradient; ``P`` carries
it. The router z-loss (ST-MoE, Zoph et al., 2022) is the mean of ``logsumexp(logits)^2``: it
keeps the logits small so that the router's softmax stays in a range where fp32 (and bf16)
rounding does not matter.

>>> logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
>>> r = route(logits, top_k=1, capacity=1)
>>> r.experts.flatten().tolist(), r.kept.flatten().tolist()  # t2 wants e0, which t0 already holds
([0, 1, 0], [True, True, False])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["expert_capacity", "Routing", "route", "load_balancing_loss", "router_z_loss"]


def expert_capacity(n_tokens: int, n_experts: int, top_k: int, capacity_factor: float | None) -> int:
    """Slots per expert: ``ceil(capacity_factor * K * T / E)``; ``None`` means no limit (``T``: a
    token picks an expert at most once, so no expert can receive more than every token).

    >>> expert_capacity(64, 4, 1, 1.25), expert_capacity(64, 4, 2, 1.0), expert_capacity(64, 4, 1, None)
    (20, 32, 64)
    """
    if capacity_factor is None:
        return n_tokens
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0 or None, got {capacity_factor!r}")
    return math.ceil(capacity_factor * top_k * n_tokens / n_experts)


@dataclass
class Routing:
    """Where each token goes. Row ``t`` of each tensor is token ``t``; column ``k`` its k-th choice."""

    probs: Tensor    # (T, E) fp32 softmax of the router logits
    experts: Tensor  # (T, K) long: chosen experts, most probable first
    gates: Tensor    # (T, K) fp32: weights of the chosen experts' outputs (probs, or renormalised)
    kept: Tensor     # (T, K) bool: False where the choice was dropped for lack of capacity

    @property
    def load(self) -> Tensor:
        """``(E,)`` choices sent to each expert before capacity (the router's wish)."""
        return torch.bincount(self.experts.flatten(), minlength=self.probs.shape[-1])

    @property
    def kept_load(self) -> Tensor:
        """``(E,)`` choices each expert actually processes (at most the capacity)."""
        return torch.bincount(self.experts[self.kept], minlength=self.probs.shape[-1])

    @property
    def dropped(self) -> int:
        """Choices dropped for lack of capacity."""
        return int((~self.kept).sum())


def route(logits: Tensor, top_k: int, capacity: int, renormalize: bool = False) -> Routing:
    """Top-K routing with a capacity of ``capacity`` choices per expert (see the module docstring).

    ``logits`` ``(T, E)``; the softmax is computed in fp32 whatever their dtype. ``renormalize``
    divides the K gates by their sum (Mixtral, GShard's top-2); without it the gates are the
    router's probabilities (Switch), so top-1 keeps a gradient to the router.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (T, E), got shape {tuple(logits.shape)}")
    T, E = logits.shape
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k must be in 1 .. E={E}, got {top_k}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    probs = torch.softmax(logits.float(), dim=-1)  # (T, E)
    gates, experts = probs.topk(top_k, dim=-1)  # (T, K), (T, K)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    # Seat in choice-major order: all first choices, then all second choices, ...
    one_hot = torch.nn.functional.one_hot(experts.t(), E)  # (K, T) -> (K, T, E)
    seat = (one_hot.flatten(0, 1).cumsum(0) * one_hot.flatten(0, 1)).sum(-1)  # (K T,): 1-based seat
    kept = (seat <= capacity).view(top_k, T).t()  # (K T,) -> (T, K)
    return Routing(probs=probs, experts=experts, gates=gates, kept=kept)


def load_balancing_loss(probs: Tensor, experts: Tensor) -> Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_e f_e P_e`` (module docstring).

    ``probs`` ``(T, E)`` router probabilities, ``experts`` ``(T, K)`` the chosen experts. With
    K > 1, ``f_e`` counts every choice (its sum over experts is K), as HuggingFace's Mixtral does.

    >>> load_balancing_loss(torch.full((4, 2), 0.5), torch.tensor([[0], [1], [0], [1]]))  # balanced
    tensor(1.)
    """
    T, E = probs.shape
    f = torch.bincount(experts.flatten(), minlength=E).to(probs.dtype) / T  # (E,), no gradient
    P = probs.mean(0)  # (T, E) -> (E,)
    return E * (f * P).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """ST-MoE's router z-loss: ``mean_t logsumexp(logits_t)^2``, in fp32. ``logits`` ``(T, E)``.

    >>> router_z_loss(torch.zeros(3, 4))  # logsumexp of four zeros is log 4
    tensor(1.9218)
    """
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
