"""The transformer block: attention and an MLP on a residual stream, each behind a norm (chapter 03).

Shapes: ``B`` batch, ``S`` positions, ``Sk`` keys, ``D`` d_model, ``F`` feed-forward width.

A block *adds* to the residual stream. Its two arrangements::

    pre-norm (GPT-2, Llama; default)         post-norm (Vaswani et al., 2017; BERT)

    x ----------+                            x ----------+
    |           |                            |           |
    norm        |                            attn        |
    attn        |                            |           |
    +  <--------+                            +  <--------+
    |                                        norm
    h ----------+                            h ----------+
    |           |                            |           |
    norm        |                            mlp         |
    mlp         |                            |           |
    +  <--------+                            +  <--------+
    |                                        norm
    out                                      out

    pre:  h = x + attn(norm(x));   out = h + mlp(norm(h))     (+ a final norm before the head)
    post: h = norm(x + attn(x));   out = norm(h + mlp(h))     (no final norm)

Pre-norm keeps an untouched path from the embedding to the head, which is why deep pre-norm
models train without warm-up tricks (Xiong et al., 2020). :class:`Block` is the block of the GPT
and of the encoder; :class:`DecoderBlock` adds cross-attention for the encoder-decoder.
Attention is :class:`course_lib.attention.MultiHeadAttention`, norms come from
:mod:`course_lib.norms`. With ``ModelConfig(moe=MoEConfig(...))`` the MLP is a mixture of
experts (:class:`course_lib.moe.MoE`, chapter 07) whose experts are :class:`MLP`-s.

The small factories :func:`make_norm_for`, :func:`final_norm` and :func:`make_rotary` are the one
place each model builds a norm or a RoPE from its config, so ``norm_eps``, ``rope_base`` and
``rope_pairing`` reach every one of them.
"""

from __future__ import annotations

import torch  # noqa: F401  (for the doctests)
import torch.nn.functional as F
from torch import Tensor, nn

from .. import attention
from ..moe import MoE
from ..norms import make_norm
from ..positional import RotaryEmbedding
from .config import ModelConfig

__all__ = ["MLP", "feed_forward", "make_norm_for", "final_norm", "make_rotary", "Block", "DecoderBlock"]


def make_norm_for(config: ModelConfig) -> nn.Module:
    """A ``(B, S, D)`` norm of ``config.norm``'s kind, with ``config.norm_eps`` and ``config.bias``."""
    return make_norm(config.norm, config.d_model, eps=config.norm_eps, bias=config.bias)


def final_norm(config: ModelConfig) -> nn.Module:
    """The norm before the head: pre-norm stacks need it; post-norm blocks already end in one."""
    return make_norm_for(config) if config.norm_position == "pre" else nn.Identity()


def make_rotary(config: ModelConfig) -> RotaryEmbedding | None:
    """The stack's RoPE (``positional="rope"``), shared by its layers; else None."""
    if config.positional != "rope":
        return None
    return RotaryEmbedding(config.head_dim, config.rope_base, pairing=config.rope_pairing)


class MLP(nn.Module):
    """Position-wise feed-forward layer, ``(B, S, D) -> (B, S, D)`` (chapter 03).

    * ``gelu``: ``down_proj(gelu(up_proj(x)))``, D -> F -> D, GELU in GPT-2's tanh approximation
      (HF's ``gelu_new``); it differs from the exact erf form by < 1e-3;
    * ``gelu_exact``: the same with the exact ``x Phi(x)`` (BERT, the original GPT; HF's ``gelu``);
    * ``swiglu`` (Shazeer, 2020; Llama): ``down_proj(silu(gate_proj(x)) * up_proj(x))``.

    The activations are torch's fused ones; :mod:`course_lib.functional` writes them out.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        D, F_, bias = config.d_model, config.ff_width, config.bias
        self.kind = config.mlp
        self.up_proj = nn.Linear(D, F_, bias=bias)
        self.gate_proj = nn.Linear(D, F_, bias=bias) if config.mlp == "swiglu" else None
        self.down_proj = nn.Linear(F_, D, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_proj is not None:
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)  # (B, S, D) -> (B, S, F)
        else:
            approximate = "tanh" if self.kind == "gelu" else "none"
            h = F.gelu(self.up_proj(x), approximate=approximate)  # (B, S, D) -> (B, S, F)
        return self.down_proj(h)  # (B, S, F) -> (B, S, D)


def feed_forward(config: ModelConfig) -> nn.Module:
    """A block's feed-forward layer: an :class:`MLP`, or with ``config.moe`` a mixture of
    ``E`` such MLPs behind a router (chapter 07)."""
    if config.moe is None:
        return MLP(config)
    return MoE(config.d_model, config.moe, make_expert=lambda: MLP(config))


def _attention(config: ModelConfig, **kw) -> attention.MultiHeadAttention:
    """The config's multi-head attention; ``kv_dim=D`` makes it a cross-attention."""
    c = config
    return attention.MultiHeadAttention(c.d_model, c.n_heads, c.n_kv_heads, bias=c.bias, dropout=c.dropout,
                                        impl=c.attn_impl, **kw)


class Block(nn.Module):
    """Attention + MLP, each wrapped in a residual connection and a norm (chapter 03).

    Pre- or post-norm as drawn in the module docstring. ``forward(x, *, mask=None, cache=None,
    rotary=None, positions=None, is_causal=False)`` with x ``(B, S, D)``; the keywords go to the
    attention layer.

    >>> Block(ModelConfig(d_model=16, n_heads=2))(torch.randn(2, 3, 16)).shape
    torch.Size([2, 3, 16])
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = _attention(config)
        self.attn_norm = make_norm_for(config)
        self.mlp = feed_forward(config)
        self.mlp_norm = make_norm_for(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, *, mask: Tensor | None = None, cache=None, rotary=None,
                positions: Tensor | None = None, is_causal: bool = False) -> Tensor:
        kw = dict(mask=mask, is_causal=is_causal, cache=cache, rotary=rotary, positions=positions)
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), **kw))
            return x + self.drop(self.mlp(self.mlp_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, **kw)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


class DecoderBlock(nn.Module):
    """Causal self-attention, cross-attention over the encoder's output, MLP (chapter 03).

    :class:`Block` with a second attention in the middle, whose keys and values come from
    ``memory`` ``(B, Sk, D)`` (the encoder's output) instead of ``x``. Each sublayer has its
    residual and norm, pre or post as in :class:`Block`::

        pre:  h = x + attn(norm(x));   c = h + cross(norm(h), memory);   out = c + mlp(norm(c))
        post: h = norm(x + attn(x));   c = norm(h + cross(h, memory));   out = norm(c + mlp(c))

    ``forward(x (B, S, D), memory (B, Sk, D), *, mask=None, cross_mask=None, rotary=None)``:
    ``mask`` is the self-attention's (pass ``causal_mask(S)``), ``cross_mask`` the
    cross-attention's (``(B, 1, 1, Sk)`` from the source padding), ``rotary`` goes to the
    self-attention only: queries and memory live on different position axes.

    >>> block = DecoderBlock(ModelConfig(d_model=16, n_heads=2))
    >>> block(torch.randn(2, 3, 16), torch.randn(2, 5, 16), mask=attention.causal_mask(3)).shape
    torch.Size([2, 3, 16])
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.attn = _attention(config)
        self.attn_norm = make_norm_for(config)
        self.cross_attn = _attention(config, kv_dim=config.d_model)
        self.cross_norm = make_norm_for(config)
        self.mlp = feed_forward(config)
        self.mlp_norm = make_norm_for(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, memory: Tensor, *, mask: Tensor | None = None,
                cross_mask: Tensor | None = None, rotary=None) -> Tensor:
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), mask=mask, rotary=rotary))
            x = x + self.drop(self.cross_attn(self.cross_norm(x), memory, mask=cross_mask))
            return x + self.drop(self.mlp(self.mlp_norm(x)))
        x = self.attn_norm(x + self.drop(self.attn(x, mask=mask, rotary=rotary)))
        x = self.cross_norm(x + self.drop(self.cross_attn(x, memory, mask=cross_mask)))
        return self.mlp_norm(x + self.drop(self.mlp(x)))
