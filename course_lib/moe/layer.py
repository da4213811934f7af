"""A mixture-of-experts feed-forward layer that replaces a block's MLP (chapter 07).

Shapes: ``B`` batch, ``S`` positions, ``D`` d_model, ``T = B S`` tokens, ``E`` experts, ``K``
experts per token.

Conditional computation (Shazeer et al., 2017; Switch Transformer, Fedus et al., 2022): ``E``
copies of the MLP, the *experts*, and a linear *router* that sends each token to ``K`` of them.
Parameters grow with ``E``; the FLOPs per token grow only with ``K``::

    x (T, D) --router--> logits (T, E) --route--> experts (T, K), gates (T, K), kept (T, K)
       |                                                      |
       +----> expert e on the tokens sent to it <-------------+
                        |
    y[t] = sum over kept choices k of  gates[t, k] * expert_{experts[t, k]}(x[t])      (T, D)

The gate multiplies the expert's output, and that product is the router's only path to the
language-model loss: without it the choice of expert would be a non-differentiable ``argmax``.
A token whose choices were all dropped gets ``y[t] = 0`` and continues on the residual stream.

Dispatch (:func:`dispatch`) has no Python loop over tokens: the kept (token, expert) pairs are
sorted by expert, each expert runs once on its contiguous slice, and ``index_add_`` puts the
weighted outputs back in token order. :func:`moe_reference` is the slow loop over tokens that it
must equal. The router runs in fp32 even under bf16 autocast (Switch's "selective precision").

``ModelConfig(moe=MoEConfig(...))`` turns every block's MLP into a :class:`MoE` whose experts are
course_lib MLPs of the config's ``mlp`` kind and width ``d_ff``. In training mode the GPT adds
:func:`aux_loss` (balancing and z-loss, weighted by the config) to its language-model loss.

>>> layer = MoE(8, MoEConfig(n_experts=4, top_k=2), make_expert=lambda: torch.nn.Linear(8, 8))
>>> y = layer(torch.randn(2, 5, 8))
>>> tuple(y.shape), tuple(layer.routing.kept.shape), layer.aux_loss.shape
((2, 5, 8), (10, 2), torch.Size([]))

Left out: router jitter noise, expert-choice routing, shared experts (DeepSeekMoE), and the
fixed-size expert buffers real systems pad to (here an expert runs on exactly its kept tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .routing import Routing, expert_capacity, load_balancing_loss, route, router_z_loss

__all__ = ["MoEConfig", "MoE", "sort_choices", "run_experts", "combine", "dispatch", "moe_reference",
           "aux_loss"]


@dataclass(frozen=True)
class MoEConfig:
    """A mixture of experts in place of each MLP (chapter 07). Defaults: a small Switch layer.

    >>> MoEConfig(n_experts=8, top_k=2, renormalize=True, capacity_factor=None)  # Mixtral's routing
    MoEConfig(n_experts=8, top_k=2, capacity_factor=None, renormalize=True, balance_coef=0.01, ...)
    """

    n_experts: int = 4                    # E experts, each an MLP of the model's mlp kind and d_ff
    top_k: int = 1                        # K experts per token: 1 = Switch, 2 = GShard / Mixtral
    capacity_factor: float | None = 1.25  # slots per expert = ceil(factor * K T / E); None = no limit
    renormalize: bool = False             # gates divided by their sum over the K choices (Mixtral)
    balance_coef: float = 0.01            # weight of the load-balancing loss (Switch's alpha)
    z_loss_coef: float = 1e-3             # weight of the router z-loss (ST-MoE)

    def __post_init__(self):
        for name in ("n_experts", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k={self.top_k} is larger than n_experts={self.n_experts}: "
                             f"a token cannot choose more experts than there are")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None (no limit), got {self.capacity_factor!r}")
        if self.renormalize and self.top_k == 1:
            raise ValueError("renormalize=True with top_k=1 makes every gate 1, so the router would get "
                             "no gradient from the loss; use it with top_k >= 2")
        for name in ("balance_coef", "z_loss_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")


def sort_choices(routing: Routing) -> tuple[Tensor, Tensor, Tensor]:
    """``(token, expert, gate)``, each ``(A,)``: the ``A`` kept choices, grouped by expert
    (tokens in order within an expert)."""
    T, K = routing.experts.shape
    token = torch.arange(T, device=routing.experts.device).repeat_interleave(K)  # (T K,)
    keep = routing.kept.flatten()  # (T K,)
    expert, token, gate = routing.experts.flatten()[keep], token[keep], routing.gates.flatten()[keep]
    order = torch.argsort(expert, stable=True)
    return token[order], expert[order], gate[order]


def run_experts(x: Tensor, expert: Tensor, experts: nn.ModuleList, first: int = 0) -> Tensor:
    """``(A, D) -> (A, D)``: row ``i`` through ``experts[expert[i] - first]``. ``x`` must be grouped
    by expert, as :func:`sort_choices` leaves it; each expert then runs once, on one slice."""
    counts = torch.bincount(expert - first, minlength=len(experts)).tolist()  # (E,) slice lengths
    chunks = x.split(counts)  # (A, D) -> E slices (count_e, D)
    return torch.cat([f(chunk) for f, chunk in zip(experts, chunks, strict=True)])  # (A, D)


def combine(out: Tensor, token: Tensor, gate: Tensor, n_tokens: int) -> Tensor:
    """``(A, D) -> (T, D)``: each choice's output times its gate, added into its token's row."""
    out = out * gate[:, None].to(out.dtype)
    return out.new_zeros(n_tokens, out.shape[-1]).index_add_(0, token, out)


def dispatch(x: Tensor, experts: nn.ModuleList, routing: Routing) -> Tensor:
    """``y (T, D)``: each kept choice's expert output, times its gate, summed per token.

    Sort the kept (token, expert) pairs by expert, run each expert once on its slice, and add
    the results back with ``index_add_``: a loop over experts, never over tokens.
    """
    token, expert, gate = sort_choices(routing)  # (A,) each
    return combine(run_experts(x[token], expert, experts), token, gate, len(x))  # (T, D)


def moe_reference(x: Tensor, logits: Tensor, experts: nn.ModuleList, top_k: int,
                  capacity: int, renormalize: bool = False) -> Tensor:
    """The slow loop :func:`route` + :func:`dispatch` must equal: every choice of every token,
    one at a time, seated in choice-major order (for tests and benchmarks only)."""
    T, E = logits.shape
    probs = torch.softmax(logits.float(), dim=-1)
    choices = [probs[t].topk(top_k) for t in range(T)]  # per token: (gates (K,), experts (K,))
    seats = [0] * E
    y = [torch.zeros_like(x[0]) for _ in range(T)]
    for k in range(top_k):
        for t in range(T):
            gates, chosen = choices[t]
            e = int(chosen[k])
            seats[e] += 1
            if seats[e] > capacity:
                continue  # expert e is full: this choice is dropped
            gate = gates[k] / gates.sum() if renormalize else gates[k]
            y[t] = y[t] + gate * experts[e](x[t])
    return torch.stack(y)


class MoE(nn.Module):
    """``(..., D) -> (..., D)``: a router and ``E`` experts made by ``make_expert()`` (chapter 07).

    After each forward pass the layer keeps, for inspection and for the GPT's loss:
    ``routing`` (a :class:`~course_lib.moe.routing.Routing`, detached), ``balance_loss`` and
    ``z_loss`` (scalars with gradients), and ``aux_loss`` = their weighted sum.
    """

    def __init__(self, d_model: int, config: MoEConfig, make_expert: Callable[[], nn.Module]):
        super().__init__()
        if not isinstance(config, MoEConfig):
            raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
        self.config = config
        self.router = nn.Linear(d_model, config.n_experts, bias=False)
        self.experts = nn.ModuleList(make_expert() for _ in range(config.n_experts))
        self.routing: Routing | None = None
        self.balance_loss = self.z_loss = self.aux_loss = None

    def router_logits(self, x: Tensor) -> Tensor:
        """``(T, D) -> (T, E)`` in fp32, outside any autocast."""
        with torch.autocast(x.device.type, enabled=False):
            return x.float() @ self.router.weight.float().t()  # (T, D) @ (D, E) -> (T, E)

    def route(self, x: Tensor) -> tuple[Tensor, Routing]:
        """Logits and routing for ``x (T, D)``; records the router losses on the layer."""
        c, D = self.config, self.router.in_features
        if x.dim() != 2 or x.shape[-1] != D:
            raise ValueError(f"expected tokens of width D={D}, got shape {tuple(x.shape)}")
        logits = self.router_logits(x)  # (T, E)
        routing = route(logits, c.top_k, expert_capacity(len(x), c.n_experts, c.top_k, c.capacity_factor),
                        c.renormalize)
        self.balance_loss = load_balancing_loss(routing.probs, routing.experts)
        self.z_loss = router_z_loss(logits)
        self.aux_loss = c.balance_coef * self.balance_loss + c.z_loss_coef * self.z_loss
        self.routing = Routing(*(t.detach() for t in (routing.probs, routing.experts, routing.gates,
                                                        routing.kept)))
        return logits, routing

    def forward(self, x: Tensor) -> Tensor:
        D = self.router.in_features
        if x.dim() < 1 or x.shape[-1] != D:
            raise ValueError(f"MoE expects inputs (..., D={D}), got shape {tuple(x.shape)}")
        tokens = x.reshape(-1, D)  # (B, S, D) -> (T, D)
        _, routing = self.route(tokens)
        return dispatch(tokens, self.experts, routing).view(x.shape)  # (T, D) -> (B, S, D)


def aux_loss(model: nn.Module) -> Tensor | float:
    """The sum of every :class:`MoE` layer's ``aux_loss`` from the last forward pass (0.0 if none)."""
    return sum((m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None), 0.0)
