"""Attention: masks, scaled dot-product, multi-head with grouped kv heads, KV caches (chapter 02).

The package, read in this order:

* ``masks``: boolean masks (True = may attend): causal, sliding window, chunked, padding,
  local/global layer patterns, :func:`combine_masks`;
* ``core``: :func:`scaled_dot_product_attention` (``impl="naive" | "sdpa"``),
  :func:`repeat_kv`, and :func:`nadaraya_watson` (attention as kernel regression);
* ``cache``: :class:`KVCache`, :class:`RollingKVCache`, :func:`kv_cache_bytes`;
* ``multihead``: :class:`MultiHeadAttention` (MHA, GQA, MQA; self and cross; cache; RoPE);
* ``linear``: :func:`linear_attention` and its quadratic twin;
* ``tiled``: :func:`tiled_attention` (FlashAttention's forward pass: an online softmax over key
  blocks, never the ``(S, Sk)`` scores) and :func:`watch_tensors`, which measures the memory.

Positional encodings (sinusoidal, learned, rotary) live in :mod:`course_lib.positional`.
Shapes everywhere: ``B`` batch, ``S`` queries, ``Sk`` keys, ``D`` d_model, ``H`` query heads,
``Hkv`` kv heads, ``G = H // Hkv``, ``Dh`` head dim.

>>> q = k = v = torch.randn(1, 2, 4, 8)
>>> out = scaled_dot_product_attention(q, k, v, causal_mask(4))
>>> torch.allclose(out, scaled_dot_product_attention(q, k, v, causal_mask(4), impl="sdpa"), atol=1e-6)
True
"""

import torch  # noqa: F401  (for the doctest above)

from .cache import KVCache, RollingKVCache, kv_cache_bytes
from .core import nadaraya_watson, repeat_kv, scaled_dot_product_attention
from .linear import elu_feature_map, linear_attention, linear_attention_quadratic
from .masks import (
    causal_mask,
    chunked_mask,
    combine_masks,
    local_global_masks,
    padding_mask,
    sliding_window_mask,
)
from .multihead import MultiHeadAttention
from .tiled import TensorWatch, tiled_attention, watch_tensors

__all__ = [
    "causal_mask",
    "sliding_window_mask",
    "chunked_mask",
    "padding_mask",
    "local_global_masks",
    "combine_masks",
    "scaled_dot_product_attention",
    "repeat_kv",
    "nadaraya_watson",
    "KVCache",
    "RollingKVCache",
    "kv_cache_bytes",
    "MultiHeadAttention",
    "linear_attention",
    "linear_attention_quadratic",
    "elu_feature_map",
    "tiled_attention",
    "TensorWatch",
    "watch_tensors",
]
