"""Positional information for attention: sinusoidal, learned and rotary (chapter 02).

Attention is permutation-equivariant: shuffle the tokens and the outputs shuffle with them.
Three ways to tell it where each token is:

* :func:`sinusoidal` (Vaswani et al., 2017): a fixed table added to the token embeddings;
* :class:`LearnedPositional` (GPT-2): a trained table, one vector per position;
* :class:`RotaryEmbedding` (RoPE; Su et al., "RoFormer", 2021/2024): rotate q and k by an
  angle proportional to their position, so that q.k depends only on the *relative* offset.

RoPE turns pairs of dimensions, and codebases disagree on which dimensions make a pair.
:class:`RotaryEmbedding` offers both (``pairing=``); the default is HuggingFace Llama's::

    "halves" (default):    (x0, x4) (x1, x5) (x2, x6) (x3, x7)    first half with second half
                           HF Llama, GPT-NeoX, "rotate half"
    "interleaved":         (x0, x1) (x2, x3) (x4, x5) (x6, x7)    pairs of neighbours
                           the RoFormer paper, Meta's original Llama code (complex numbers), GPT-J

The two are the same rotation after permuting the dimensions of q and k within each head
(interleaved -> halves: ``x0 x2 x4 x6 | x1 x3 x5 x7``), which is how Meta's Llama checkpoints
are converted to HuggingFace's: the rows of ``q_proj`` and ``k_proj`` are permuted once, and
the model computes the same scores.

Left out: ALiBi, NoPE, RoPE scaling for long context (NTK, YaRN, Llama 3's frequency bands).
Shapes: ``S`` positions, ``D`` model width, ``Dh`` head dim, ``B`` batch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["sinusoidal", "LearnedPositional", "RotaryEmbedding", "rotate_half", "rotate_pairs", "PAIRINGS"]

PAIRINGS = ("halves", "interleaved")  # RoPE's two layouts; see the module docstring


def sinusoidal(context_length: int, d_model: int, base: float = 10000.0, *, device=None,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """The fixed table ``PE[t, 2i] = sin(t / base^(2i/D))``, ``PE[t, 2i+1] = cos(t / base^(2i/D))``.

    Returns ``(context_length, D)``. Pair i turns at frequency ``base^(-2i/D)``, from one radian
    per token (i = 0) down to one turn in ~``2 pi base`` tokens, so ``PE[t + k]`` is a fixed
    rotation of ``PE[t]`` in every (sin, cos) pair. The third lecture calls ``base`` "a maximum
    sequence length"; it is a fixed constant (10000 in the paper), unrelated to the context length.

    >>> sinusoidal(2, 4)
    tensor([[0.0000, 1.0000, 0.0000, 1.0000],
            [0.8415, 0.5403, 0.0100, 0.9999]])
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal needs an even d_model (sin/cos pairs), got {d_model}")
    t = torch.arange(context_length, device=device, dtype=torch.float64)[:, None]  # (S, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, device=device, dtype=torch.float64) / d_model)  # (D/2,)
    angles = t * inv_freq  # (S, 1) * (D/2,) -> (S, D/2)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (S, D/2) -> (S, D/2, 2)
    return pe.flatten(-2).to(dtype)  # (S, D/2, 2) -> (S, D): sin, cos, sin, cos, ...


class LearnedPositional(nn.Module):
    """A trained position table: ``nn.Embedding(context_length, d_model)`` (as in GPT-2).

    ``forward(positions)``: ``(S,) -> (S, D)`` or ``(B, S) -> (B, S, D)``. It cannot extrapolate:
    a position ``>= context_length`` has no row, and is a ValueError.

    >>> LearnedPositional(8, 4)(torch.arange(3)).shape
    torch.Size([3, 4])
    """

    def __init__(self, context_length: int, d_model: int):
        super().__init__()
        self.context_length = context_length
        self.embedding = nn.Embedding(context_length, d_model)

    def forward(self, positions: Tensor) -> Tensor:
        has_values = positions.numel() and positions.device.type != "meta"  # meta: shapes only
        lo, hi = (int(positions.min()), int(positions.max())) if has_values else (0, 0)
        if lo < 0 or hi >= self.context_length:
            raise ValueError(f"positions must lie in 0 .. {self.context_length - 1} (context_length="
                             f"{self.context_length}), got min {lo}, max {hi}")
        return self.embedding(positions)  # (S,) -> (S, D) or (B, S) -> (B, S, D)


def rotate_half(x: Tensor) -> Tensor:
    """``(x1, x2) -> (-x2, x1)`` on the two halves of the last dim: a 90-degree turn per pair
    ``(x_i, x_{i + Dh/2})``.

    >>> rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor([-3., -4.,  1.,  2.])
    """
    x1, x2 = x.chunk(2, dim=-1)  # (..., Dh) -> 2 x (..., Dh/2)
    return torch.cat([-x2, x1], dim=-1)  # -> (..., Dh)


def rotate_pairs(x: Tensor) -> Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``: a 90-degree turn per pair of
    neighbours ``(x_{2i}, x_{2i+1})``, the interleaved layout's :func:`rotate_half`.

    >>> rotate_pairs(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor([-2.,  1., -4.,  3.])
    """
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., Dh) -> 2 x (..., Dh/2)
    return torch.stack([-odd, even], dim=-1).flatten(-2)  # (..., Dh/2, 2) -> (..., Dh)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE); ``pairing`` picks the layout (module docstring).

    Pair i at position m is rotated by the angle ``m * theta_i`` with ``theta_i = base^(-2i/Dh)``.
    With ``pairing="halves"`` (default) pair i is ``(x_i, x_{i + Dh/2})``::

        x_i'        = x_i cos(m theta_i) - x_{i+Dh/2} sin(m theta_i)
        x_{i+Dh/2}' = x_i sin(m theta_i) + x_{i+Dh/2} cos(m theta_i)

    with ``pairing="interleaved"`` it is ``(x_{2i}, x_{2i+1})``, the same formula: read as one
    complex number ``x_{2i} + i x_{2i+1}``, the pair is multiplied by ``e^{i m theta_i}``.

    Rotations preserve norms, and ``<R_m q, R_n k> = <q, R_{n-m} k>`` depends on ``m - n`` only.
    ``forward(x, positions)``: x ``(..., S, Dh)``, positions ``(S,)`` or ``(B, S)`` integers
    (with (B, S), x is ``(B, S, Dh)`` or ``(B, H, S, Dh)``). Angles are computed in fp32 and
    the result is cast back to x's dtype.

    >>> rope = RotaryEmbedding(2)
    >>> rope(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))   # (cos 1, sin 1)
    tensor([[0.5403, 0.8415]])
    >>> x, m = torch.tensor([[1.0, 0.0, 0.0, 0.0]]), torch.tensor([1])   # Dh = 4: the layouts differ
    >>> RotaryEmbedding(4)(x, m), RotaryEmbedding(4, pairing="interleaved")(x, m)
    (tensor([[0.5403, 0.0000, 0.8415, 0.0000]]), tensor([[0.5403, 0.8415, 0.0000, 0.0000]]))
    """

    def __init__(self, head_dim: int, base: float = 10000.0, pairing: str = "halves"):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RotaryEmbedding needs an even head_dim (pairs of dims), got {head_dim}")
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
        self.head_dim, self.base, self.pairing = head_dim, base, pairing
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # (Dh/2,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # moves with .to(device)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"x's last dim must be head_dim={self.head_dim}, got shape {tuple(x.shape)}")
        if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
            raise ValueError(f"positions must be (S,) or (B, S) with S = x.shape[-2] = {x.shape[-2]}, "
                             f"got shape {tuple(positions.shape)}")
        pos = positions.to(self.inv_freq.device, torch.float32)  # (S,) or (B, S)
        angles = pos[..., None] * self.inv_freq  # (..., S, 1) * (Dh/2,) -> (..., S, Dh/2)
        if self.pairing == "halves":  # dims i and i + Dh/2 share an angle
            angles = torch.cat([angles, angles], dim=-1)  # (..., S, Dh/2) -> (..., S, Dh)
            turn = rotate_half
        else:  # dims 2i and 2i + 1 share an angle
            angles = angles.repeat_interleave(2, dim=-1)  # (..., S, Dh/2) -> (..., S, Dh)
            turn = rotate_pairs
        if positions.dim() == 2:  # (B, S, Dh) -> (B, 1, .., 1, S, Dh) to skip x's head dims
            angles = angles.view(angles.shape[0], *([1] * (x.dim() - 3)), *angles.shape[1:])
        cos, sin = angles.cos(), angles.sin()
        xf = x.float()
        return (xf * cos + turn(xf) * sin).to(x.dtype)  # (..., S, Dh)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base}, pairing={self.pairing!r}"
