"""Multi-head attention with grouped key/value heads (MHA, GQA, MQA), self and cross (chapter 02).

Shapes: ``B`` batch, ``S`` queries, ``Sk`` keys, ``D`` d_model, ``H`` query heads, ``Hkv``
key/value heads, ``G = H // Hkv`` query heads per kv head, ``Dh = D // H``, ``Dkv`` = ``kv_dim``
(the context's width in cross-attention).

Vaswani et al. (2017) give every query head its own key and value head. Shazeer (2019, MQA)
shares one kv head among all query heads; Ainslie et al. (2023, GQA) share each kv head among
a group of G, which divides the KV cache by G::

    MHA (Hkv = H = 4):     GQA (Hkv = 2, G = 2):     MQA (Hkv = 1):
      q0 q1 q2 q3            q0 q1   q2 q3             q0 q1 q2 q3
      |  |  |  |              \\ /     \\ /               \\  \\ /  /
      k0 k1 k2 k3              k0       k1                  k0

The projections are ``nn.Linear``s named as in HuggingFace (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``), so LoRA can swap them and checkpoints map onto them. Left out: QK-norm, attention
sinks, a cross-attention cache, packed ``in_proj`` weights (torch's layout; a test copies
them across).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from .cache import KVCache, RollingKVCache
from .core import IMPLS, broadcast_shape, repeat_kv, scaled_dot_product_attention
from .masks import causal_mask, sliding_window_mask

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention; ``n_kv_heads`` < ``n_heads`` gives GQA, 1 gives MQA (chapter 02).

    ``forward(x, context=None, *, mask=None, is_causal=False, cache=None, rotary=None,
    positions=None, return_weights=False)``:

    * x ``(B, S, D)``; ``context`` ``(B, Sk, kv_dim)`` for cross-attention (keys and values
      come from it; default ``x``).
    * ``mask``: bool, True = may attend, broadcastable to ``(B, H, S, Sk)``. None means no mask,
      except with a cache (below).
    * ``cache``: a :class:`KVCache` or :class:`RollingKVCache` (self-attention only); this
      call's k, v are appended and the queries attend to everything cached. Rotary positions
      start at ``cache.length`` before the update. With ``mask=None`` the default is
      ``causal_mask(S, Sk)`` for a ``KVCache`` (so a multi-token prefill is causal; one token
      sees all the past) and ``sliding_window_mask(S, cache.window, Sk)`` for a
      ``RollingKVCache``. Without a cache, pass the mask you want (e.g. ``causal_mask(S)``).
    * ``is_causal``: causal self-attention without a mask (the fused kernel skips the masked
      half, and no mask is built or read); with a cache holding earlier tokens, or a rolling
      one, the cache's own mask as for ``mask=None``.
    * ``rotary``: a :class:`course_lib.positional.RotaryEmbedding` applied to q and k at
      their absolute positions (self-attention only).
    * ``positions``: rotary's positions of the new tokens, ``(S,)`` or per row ``(B, S)``
      (left-padded batches count only real tokens); default ``cache.length + arange(S)``.
      Only rotary uses them.

    Returns ``(B, S, D)``, or ``(out, weights (B, H, S, Sk))`` if ``return_weights``.

    >>> mha = MultiHeadAttention(8, 4, n_kv_heads=2)
    >>> tuple(mha.q_proj.weight.shape), tuple(mha.k_proj.weight.shape), mha.head_dim
    ((8, 8), (4, 8), 2)
    >>> mha(torch.randn(2, 5, 8), mask=causal_mask(5)).shape
    torch.Size([2, 5, 8])
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, *, bias: bool = False,
                 dropout: float = 0.0, impl: str = "naive", kv_dim: int | None = None):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if min(d_model, n_heads, n_kv_heads) < 1:
            raise ValueError(f"d_model, n_heads, n_kv_heads must be >= 1, "
                             f"got {d_model}, {n_heads}, {n_kv_heads}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads} (each kv "
                             f"head serves a group of G = n_heads // n_kv_heads query heads)")
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.kv_dim = d_model if kv_dim is None else kv_dim
        self.dropout, self.impl = dropout, impl
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(self.kv_dim, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(self.kv_dim, n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def _check(self, x: Tensor, context: Tensor | None, cache, rotary, positions: Tensor | None) -> None:
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (B, S, D={self.d_model}), got shape {tuple(x.shape)}")
        if context is None and self.kv_dim != self.d_model:
            raise ValueError(f"this layer has kv_dim={self.kv_dim} != d_model={self.d_model}: pass context")
        if context is not None:
            if context.dim() != 3 or context.shape[-1] != self.kv_dim or context.shape[0] != x.shape[0]:
                raise ValueError(f"context must be (B={x.shape[0]}, Sk, kv_dim={self.kv_dim}), "
                                 f"got shape {tuple(context.shape)}")
            if cache is not None or rotary is not None:
                raise ValueError("cache and rotary are for self-attention; got them with a context "
                                 "(cross-attention)")
        if cache is not None and not isinstance(cache, (KVCache, RollingKVCache)):
            raise ValueError(f"cache must be a KVCache or RollingKVCache, got {type(cache).__name__}")
        if positions is not None:
            B, S = x.shape[:2]
            if context is not None:
                raise ValueError("positions are for rotary self-attention; got them with a context "
                                 "(cross-attention)")
            if tuple(positions.shape) not in ((S,), (B, S)):
                raise ValueError(f"positions must be (S={S},) or (B={B}, S={S}), got shape "
                                 f"{tuple(positions.shape)}")

    def forward(self, x: Tensor, context: Tensor | None = None, *, mask: Tensor | None = None,
                is_causal: bool = False, cache: KVCache | RollingKVCache | None = None,
                rotary: nn.Module | None = None, positions: Tensor | None = None,
                return_weights: bool = False):
        self._check(x, context, cache, rotary, positions)
        if is_causal and (mask is not None or context is not None):
            raise ValueError("is_causal is for self-attention without a mask")
        B, S, _ = x.shape
        kv_in = x if context is None else context
        q = rearrange(self.q_proj(x), "b s (h d) -> b h s d", h=self.n_heads)  # (B, S, D) -> (B, H, S, Dh)
        Hkv = self.n_kv_heads
        k = rearrange(self.k_proj(kv_in), "b s (h d) -> b h s d", h=Hkv)  # (B, Sk, Dkv) -> (B, Hkv, Sk, Dh)
        v = rearrange(self.v_proj(kv_in), "b s (h d) -> b h s d", h=Hkv)  # (B, Sk, Dkv) -> (B, Hkv, Sk, Dh)

        start = cache.length if cache is not None else 0
        if rotary is not None:
            if positions is None:
                positions = torch.arange(start, start + S, device=x.device)  # (S,) absolute positions
            q, k = rotary(q, positions), rotary(k, positions)  # positions (S,) or (B, S)
        if cache is not None:
            k, v = cache.update(k, v)  # (B, Hkv, S, Dh) -> (B, Hkv, Sk, Dh) with the past
        Sk = k.shape[-2]

        if is_causal and (Sk != S or isinstance(cache, RollingKVCache)):
            is_causal = False  # earlier tokens in the cache, or a window: the cache's mask below
        if mask is None and isinstance(cache, RollingKVCache):
            mask = sliding_window_mask(S, cache.window, Sk, device=x.device)  # (S, Sk)
        elif mask is None and not is_causal and cache is not None and S > 1:  # one query sees all the cache
            mask = causal_mask(S, Sk, device=x.device)  # (S, Sk)
        if mask is not None:
            expected = (B, self.n_heads, S, Sk)
            try:
                ok = mask.dim() <= 4 and broadcast_shape(mask.shape, expected) == expected
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                                 f"(B, H, S, Sk) = {expected}")

        G = self.n_heads // self.n_kv_heads
        k, v = repeat_kv(k, G), repeat_kv(v, G)  # (B, Hkv, Sk, Dh) -> (B, H, Sk, Dh)
        result = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal, impl=self.impl,
                                              return_weights=return_weights,
                                              dropout_p=self.dropout if self.training else 0.0)
        out, weights = result if return_weights else (result, None)
        out = self.o_proj(rearrange(out, "b h s d -> b s (h d)"))  # (B, H, S, Dh) -> (B, S, D)
        return (out, weights) if return_weights else out
