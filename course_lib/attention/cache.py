"""Key/value caches for incremental decoding, and what they cost in memory (chapter 02).

When generating token t, the keys and values of tokens 0 .. t-1 do not change (causal
attention), so we keep them instead of recomputing the whole prefix every step::

    step 0:  prefill "The cat"   cache: [k0 k1]
    step 1:  new token "sat"     cache: [k0 k1 k2]        q2 attends to k0..k2
    step 2:  new token "on"      cache: [k0 k1 k2 k3]     q3 attends to k0..k3

:class:`KVCache` preallocates ``capacity`` positions. :class:`RollingKVCache` serves
sliding-window attention: it keeps only the last ``window`` positions, so its memory does not
grow with the sequence (Mistral's rolling buffer). :func:`kv_cache_bytes` is the accounting.

Caches hold keys *after* rotary embedding (rotated at their absolute positions), one cache per
layer, and are meant for inference under ``torch.no_grad()``: they write in place. Left out:
paged caches, quantised caches, a cache for cross-attention (compute the context's k, v once).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KVCache", "RollingKVCache", "kv_cache_bytes"]


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, context_length: int,
                   batch_size: int = 1, bytes_per_element: int = 2) -> int:
    """Bytes held by a full KV cache: 2 (k and v) x L x B x context x Hkv x Dh x bytes.

    Llama-2-7B (32 layers, 32 kv heads of 128, 4096 tokens, fp16) needs 2 GiB per sequence;
    with GQA's 8 kv heads (Llama-2-70B's ratio) a quarter of that:

    >>> kv_cache_bytes(32, 32, 128, 4096) / 2**30
    2.0
    >>> kv_cache_bytes(32, 8, 128, 4096) / 2**30
    0.5
    """
    return 2 * n_layers * batch_size * context_length * n_kv_heads * head_dim * bytes_per_element


class _Buffers:
    """What both caches share: ``(B, Hkv, slots, Dh)`` buffers for k and v, a token count,
    and the shape check of what is appended."""

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, slots: int, slots_name: str,
                 device, dtype: torch.dtype):
        if min(batch_size, n_kv_heads, head_dim, slots) < 1:
            raise ValueError(f"sizes must be >= 1, got batch_size={batch_size}, n_kv_heads={n_kv_heads}, "
                             f"head_dim={head_dim}, {slots_name}={slots}")
        self.batch_size, self.n_kv_heads, self.head_dim = batch_size, n_kv_heads, head_dim
        self.k = torch.zeros(batch_size, n_kv_heads, slots, head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def _check(self, k: Tensor, v: Tensor) -> None:
        expected = (self.batch_size, self.n_kv_heads, k.shape[-2] if k.dim() == 4 else -1, self.head_dim)
        if k.dim() != 4 or tuple(k.shape) != expected or k.shape != v.shape:
            raise ValueError(f"{type(self).__name__} expects k and v of shape (B={self.batch_size}, "
                             f"Hkv={self.n_kv_heads}, S_new, Dh={self.head_dim}), got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")

    def reset(self) -> None:
        """Forget everything (the buffers are reused)."""
        self.length = 0


class KVCache(_Buffers):
    """Preallocated cache of keys and values, ``(B, Hkv, capacity, Dh)`` each (chapter 02).

    >>> cache = KVCache(1, 2, 4, capacity=8)
    >>> k_all, v_all = cache.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    >>> cache.length, tuple(k_all.shape)
    (3, (1, 2, 3, 4))
    """

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, capacity: int, *,
                 device=None, dtype: torch.dtype = torch.float32):
        super().__init__(batch_size, n_kv_heads, head_dim, capacity, "capacity", device, dtype)
        self.capacity = capacity

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``(B, Hkv, S_new, Dh)`` keys and values; return all cached ``(B, Hkv, length, Dh)``."""
        self._check(k, v)
        end = self.length + k.shape[-2]
        if end > self.capacity:
            raise ValueError(f"KVCache of capacity {self.capacity} cannot hold {end} positions "
                             f"({self.length} cached + {k.shape[-2]} new)")
        self.k[:, :, self.length:end] = k  # (B, Hkv, S_new, Dh) written into (B, Hkv, capacity, Dh)
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]  # (B, Hkv, length, Dh) views


class RollingKVCache(_Buffers):
    """Cache for sliding-window attention that keeps only the last ``window`` keys and values.

    ``length`` counts every token seen; the buffers stay ``(B, Hkv, window, Dh)``. ``update``
    returns the kept past (at most ``window - 1`` positions, all a new query can still see)
    followed by the new ones, in order::

        window 3, after tokens 0..4:  buffer [k2 k3 k4]
        update(k5) returns            [k3 k4 k5]          (k2 is out of q5's window)

    With one new token that is exactly the window; with ``S_new > 1`` it is
    ``window - 1 + S_new`` positions, and ``sliding_window_mask(S_new, window, Sk)`` (the
    default in :class:`MultiHeadAttention`) hides what each new query must not see. Masks only
    depend on relative positions here, so the shifted frame changes nothing.
    This version keeps the buffer in order by copying (O(window) per step); a ring buffer
    with a write pointer avoids the copy at the price of unrolling on read.

    >>> cache = RollingKVCache(1, 1, 2, window=3)
    >>> for t in range(5):
    ...     k_all, _ = cache.update(torch.full((1, 1, 1, 2), float(t)), torch.zeros(1, 1, 1, 2))
    >>> cache.length, k_all[0, 0, :, 0].tolist(), tuple(cache.k.shape)
    (5, [2.0, 3.0, 4.0], (1, 1, 3, 2))
    """

    def __init__(self, batch_size: int, n_kv_heads: int, head_dim: int, window: int, *,
                 device=None, dtype: torch.dtype = torch.float32):
        super().__init__(batch_size, n_kv_heads, head_dim, window, "window", device, dtype)
        self.window = window

    @property
    def kept(self) -> int:
        """How many positions the buffer holds now: ``min(length, window)``."""
        return min(self.length, self.window)

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``(B, Hkv, S_new, Dh)``; return ``(B, Hkv, min(length_before, window - 1) + S_new, Dh)``."""
        self._check(k, v)
        n_past = min(self.kept, self.window - 1)
        past = slice(self.kept - n_past, self.kept)
        k_all = torch.cat([self.k[:, :, past], k.to(self.k.dtype)], dim=2)  # -> (B, Hkv, n_past + S_new, Dh)
        v_all = torch.cat([self.v[:, :, past], v.to(self.v.dtype)], dim=2)  # -> (B, Hkv, n_past + S_new, Dh)
        self.length += k.shape[-2]
        n_keep = min(self.length, self.window)
        self.k[:, :, :n_keep] = k_all[:, :, -n_keep:]  # the last `window` positions, oldest first
        self.v[:, :, :n_keep] = v_all[:, :, -n_keep:]
        return k_all, v_all
