"""Optimizers written out: AdamW, Muon, global-norm clipping and the learning-rate schedule (chapter 03).

The teaching path beside the fast path: :class:`AdamW` equals ``torch.optim.AdamW``,
:func:`clip_grad_norm` equals ``torch.nn.utils.clip_grad_norm_``, step by step (tests compare
them on several models); :func:`course_lib.train.train` runs on either (``TrainConfig.optimizer``).

One training step, in the order :func:`course_lib.train.train` calls them::

    loss.backward()                         p.grad for every parameter
    clip_grad_norm(params, max_norm)        rescale all gradients together: ||g||_2 <= max_norm
    lr = cosine_schedule(step, ...)         linear warm-up, then cosine decay (drawn in course_lib.train)
    optimizer.step()                        AdamW, or Muon for the hidden matrices + AdamW for the rest

Muon (Jordan et al., 2024, "Muon: an optimizer for hidden layers in neural networks", the
public description followed here) replaces the update of a weight matrix by the *orthogonalised*
momentum: every singular value set to about 1, keeping the singular vectors::

    momentum M (rows, cols)  =  U diag(s_1 ... s_r) V^T      a few large s_i dominate
    update                   ~  U diag(1   ...   1) V^T      every direction gets the same step

computed without an SVD by five Newton-Schulz matrix products (:func:`newton_schulz`).
Embeddings, the output head and 1-D parameters (biases, norm gains) stay on AdamW
(:func:`split_for_muon` picks which is which).

Left out: amsgrad, maximize, sparse gradients, fused/foreach kernels, Muon for conv filters
(> 2-D), and Muon's distributed version (each rank orthogonalising its share of the matrices).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn

__all__ = ["cosine_schedule", "clip_grad_norm", "AdamW", "newton_schulz", "split_for_muon", "Muon"]


def cosine_schedule(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """The learning rate for update number ``step`` (0-based): linear warm-up, then cosine decay.

    With ``W = warmup_steps``, ``T = max_steps``, ``p = min(1, (step - W) / max(1, T - W))``::

        step <  W:  lr * step / W                                       (0 at step 0)
        step >= W:  min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2     (lr at W, min_lr from T on)

    >>> [cosine_schedule(s, lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110) for s in (0, 5, 10)]
    [0.0, 0.5, 1.0]
    """
    if not 0 <= warmup_steps <= max_steps:
        raise ValueError(f"need 0 <= warmup_steps <= max_steps, got {warmup_steps} and {max_steps}")
    W, T = warmup_steps, max_steps
    if step < W:
        return lr * step / W
    progress = min(1.0, (step - W) / max(1, T - W))
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


@torch.no_grad()
def clip_grad_norm(params: Iterable[Tensor] | Tensor, max_norm: float) -> Tensor:
    """Scale all gradients by one factor so that their global L2 norm is at most ``max_norm``.

    The gradients of all parameters are one long vector ``g``::

        norm = ||g||_2 = sqrt(sum_p ||g_p||_2^2)
        g_p <- g_p * min(1, max_norm / (norm + 1e-6))      for every p

    One factor for all keeps the update's direction (clipping each tensor alone would turn
    it). Parameters without a gradient are skipped. Returns ``norm`` before clipping (0-d
    tensor; 0 when no parameter has a gradient). Equals ``torch.nn.utils.clip_grad_norm_``
    (the same norm and the same scaled gradients); the factor is clamped, not chosen with an
    ``if``, so a GPU never waits for the CPU to read the norm.

    >>> w = torch.zeros(2, requires_grad=True); w.grad = torch.tensor([3.0, 4.0])
    >>> clip_grad_norm([w], max_norm=1.0), w.grad     # norm 5 -> scaled by 1 / 5
    (tensor(5.), tensor([0.6000, 0.8000]))
    """
    if isinstance(params, Tensor):
        params = [params]
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    device = grads[0].device
    norms = torch.stack([torch.linalg.vector_norm(g).to(device) for g in grads])  # (n_params,)
    total = torch.linalg.vector_norm(norms)  # sqrt(sum_p ||g_p||^2)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)  # below 1 only when total > max_norm
    for g in grads:
        g.mul_(scale.to(g.device))
    return total


def _adamw_update(p: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    """One AdamW update of ``p`` in place; ``state`` holds its step count and moments.

    Op for op torch.optim.AdamW's single-tensor path (the CPU's), so the rounding is the same.
    """
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p)  # m
        state["exp_avg_sq"] = torch.zeros_like(p)  # v
    state["step"] = int(state["step"]) + 1  # int(): torch.optim.AdamW's state keeps a tensor here
    t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
    lr, (beta1, beta2) = group["lr"], group["betas"]
    if group["weight_decay"]:
        p.mul_(1 - lr * group["weight_decay"])  # decoupled: shrink p itself, never through g
    m.lerp_(grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g, computed as m + (1 - beta1)(g - m)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
    bias1, bias2 = 1 - beta1**t, 1 - beta2**t  # m, v start at 0: early averages are too small
    denom = (v.sqrt() / bias2**0.5).add_(group["eps"])  # sqrt(v_hat) + eps
    p.addcdiv_(m, denom, value=-lr / bias1)  # p -= lr m_hat / (sqrt(v_hat) + eps)


def _check_hyperparameters(lr: float, eps: float, weight_decay: float, betas: tuple[float, float]) -> None:
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")


def _step(optimizer: torch.optim.Optimizer, closure, update_for) -> Tensor | None:
    """torch.optim's step protocol, shared by both optimizers: the closure (if any) recomputes the
    loss with gradients on; then ``update_for(group)(p, p.grad, state, group)`` for every
    parameter that has a gradient. Returns the closure's loss or None."""
    loss = None
    if closure is not None:
        with torch.enable_grad():
            loss = closure()
    for group in optimizer.param_groups:
        update = update_for(group)
        for p in group["params"]:
            if p.grad is not None:
                update(p, p.grad, optimizer.state[p], group)
    return loss


class AdamW(torch.optim.Optimizer):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019), written out (chapter 03).

    For each parameter ``p`` with gradient ``g``, at its step ``t = 1, 2, ...``::

        p <- p - lr * weight_decay * p           decoupled decay, before the Adam step (as torch)
        m <- beta1 m + (1 - beta1) g             running mean of g
        v <- beta2 v + (1 - beta2) g^2           running mean of g^2 (elementwise)
        m_hat, v_hat = m / (1 - beta1^t), v / (1 - beta2^t)      bias correction
        p <- p - lr * m_hat / (sqrt(v_hat) + eps)

    Param groups may set their own ``lr``, ``betas``, ``eps`` and ``weight_decay``
    (:func:`course_lib.train.make_optimizer` decays matrices only), and the trainer rewrites
    ``group["lr"]`` every step. ``state_dict`` and ``load_state_dict`` are the base class's, so
    a checkpoint resumes exactly. Equals ``torch.optim.AdamW`` bit for bit on the CPU, where
    torch runs the same per-tensor ops in the same order; parameters without a gradient are
    skipped and keep their step count, as in torch. It loads torch's AdamW state_dict too.

    >>> w = nn.Parameter(torch.tensor([1.0, -1.0])); w.grad = torch.tensor([0.5, -2.0])
    >>> _ = AdamW([w], lr=0.1, weight_decay=0.0).step(); w.data   # step 1: m_hat / sqrt(v_hat) = sign(g)
    tensor([ 0.9000, -0.9000])
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        _check_hyperparameters(lr, eps, weight_decay, betas)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        return _step(self, closure, lambda group: _adamw_update)


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan's quintic: steep at 0, then hovers near 1


def newton_schulz(G: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Approximately ``U V^T`` for ``G = U S V^T`` (rows, cols), by Newton-Schulz iteration.

    ``X = G / ||G||_F`` puts every singular value in [0, 1] (the Frobenius norm is at least the
    largest one). Each step ``X <- a X + b (X X^T) X + c (X X^T)^2 X`` keeps the singular
    vectors and maps every singular value ``s`` to ``a s + b s^3 + c s^5``, with
    ``(a, b, c) = (3.4445, -4.7750, 2.0315)``: chosen to grow small values fast (slope 3.4 at 0)
    rather than to converge, so after 5 steps a singular value that started above ~0.001 of
    ``||G||_F`` ends in roughly [0.5, 1.2], not at exactly 1 (which trains no better). A tall
    ``G`` is transposed so that ``X X^T`` is the smaller Gram matrix. Computes in fp32 (float64
    stays float64; Jordan's GPU code uses bf16) and returns ``G``'s dtype and shape.

    >>> G = torch.tensor([[3.0, 0.0], [0.0, 0.1]])     # U = V = I, singular values 3 and 0.1
    >>> newton_schulz(G)                               # ~ I: both pushed near 1
    tensor([[0.6970, 0.0000],
            [0.0000, 1.1288]])
    """
    if G.dim() != 2:
        raise ValueError(f"newton_schulz needs a matrix (rows, cols), got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFICIENTS
    X = G.to(torch.promote_types(G.dtype, torch.float32))
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.mT  # (rows, cols) -> (cols, rows): rows <= cols from here on
    X = X / (torch.linalg.matrix_norm(X) + eps)  # Frobenius norm: singular values now <= 1
    for _ in range(steps):
        A = X @ X.mT  # (r, r), r = min(rows, cols): U S^2 U^T
        X = a * X + (b * A + c * A @ A) @ X  # U (a S + b S^3 + c S^5) V^T
    if tall:
        X = X.mT
    return X.to(G.dtype)


def split_for_muon(model: nn.Module, head_names: tuple[str, ...] = ("lm_head", "head")
                   ) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """``(matrices, others)``: the trainable parameters of ``model``, split for :class:`Muon`.

    ``matrices`` are the weights of its hidden ``nn.Linear`` layers (attention projections,
    MLPs, MoE routers); ``others`` is everything else, for AdamW: embeddings, the output head
    (a Linear named one of ``head_names``, or one whose weight is tied to an embedding), biases
    and norm gains. The head and embeddings look up or score single tokens, which Jordan found
    better left to AdamW. A tied parameter is listed once.
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    heads = {id(m.weight) for name, m in model.named_modules()
             if isinstance(m, nn.Linear) and name.split(".")[-1] in head_names}
    hidden = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)} - embeddings - heads
    trainable = [p for p in model.parameters() if p.requires_grad]  # each Parameter once
    return [p for p in trainable if id(p) in hidden], [p for p in trainable if id(p) not in hidden]


def _muon_update(p: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    """One Muon update of the matrix ``p`` (rows, cols) in place; ``state`` holds the momentum."""
    if not state:
        state["momentum_buffer"] = torch.zeros_like(p)  # M
    M, mu, lr = state["momentum_buffer"], group["momentum"], group["lr"]
    M.lerp_(grad, 1 - mu)  # M = mu M + (1 - mu) g
    update = grad.lerp(M, mu) if group["nesterov"] else M  # Nesterov: (1 - mu) g + mu M, a look-ahead
    ortho = newton_schulz(update, group["ns_steps"])  # (rows, cols), singular values ~1
    rows, cols = p.shape
    if group["weight_decay"]:
        p.mul_(1 - lr * group["weight_decay"])
    p.add_(ortho, alpha=-lr * max(1, rows / cols) ** 0.5)  # a tall matrix's O has a smaller RMS: scale up


class Muon(torch.optim.Optimizer):
    """Muon for hidden matrices and AdamW for the rest, in one optimizer (chapter 03).

    Each param group says which update it gets, as in Jordan's ``MuonWithAuxAdam``:

    * ``use_muon=True`` (the default): 2-D parameters only. With momentum ``mu``::

          M <- mu M + (1 - mu) g                       momentum (a running mean)
          U =  (1 - mu) g + mu M   (nesterov)  or  M
          p <- p - lr * weight_decay * p - lr * max(1, rows / cols)^(1/2) * newton_schulz(U)

    * ``use_muon=False``: the :class:`AdamW` update (the same function), with ``betas``,
      ``eps``, ``weight_decay`` and usually a much smaller ``lr`` set in the group.

    ``lr`` and ``weight_decay`` apply to both kinds; ``momentum``, ``nesterov`` and
    ``ns_steps`` to Muon groups; ``betas`` and ``eps`` to AdamW groups. Muon's ``lr`` is in
    units of "spectral norm per step": 0.02 (Jordan's default) moves a square matrix's
    singular values by ~0.02.

    >>> model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8))
    >>> matrices, others = split_for_muon(model)
    >>> opt = Muon([{"params": matrices},                                       # the Linear weight
    ...             {"params": others, "use_muon": False, "lr": 1e-3}])         # the rest: AdamW
    >>> [len(g["params"]) for g in opt.param_groups]
    [1, 4]
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8):
        _check_hyperparameters(lr, eps, weight_decay, betas)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 1:
            raise ValueError(f"ns_steps must be an int >= 1, got {ns_steps!r}")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                        weight_decay=weight_decay, betas=betas, eps=eps, use_muon=True)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)  # fills in the defaults
        group = self.param_groups[-1]
        shapes = [tuple(p.shape) for p in group["params"] if p.dim() != 2]
        if group["use_muon"] and shapes:
            self.param_groups.pop()
            raise ValueError(f"a use_muon group takes matrices (2-D) only, got shapes {shapes}; put "
                             f"the others in a group with use_muon=False (see split_for_muon)")

    @torch.no_grad()
    def step(self, closure=None):
        return _step(self, closure, lambda group: _muon_update if group["use_muon"] else _adamw_update)
