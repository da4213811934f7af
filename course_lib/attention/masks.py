"""Attention masks as boolean tensors: True = this query may attend to this key (chapter 02).

A mask has shape ``(S, Sk)`` and broadcasts over ``(B, H)``; ``padding_mask`` gives
``(B, 1, 1, Sk)``. Query ``i`` of ``S`` sits at absolute position ``Sk - S + i``: the queries
are the *last* ``S`` of the ``Sk`` positions. Without a cache ``Sk == S`` and nothing changes;
with a KV cache one new query (``S = 1``) sits at the end of ``Sk = past + 1`` keys, so the
same functions serve training and decoding.

Pictures for ``S = Sk = 5`` (rows are queries, columns keys, ``x`` = may attend)::

    causal            sliding window 2     chunked, chunk 2     chunked, causal=False
    x . . . .         x . . . .            x . . . .            x x . . .
    x x . . .         x x . . .            x x . . .            x x . . .
    x x x . .         . x x . .            . . x . .            . . x x .
    x x x x .         . . x x .            . . x x .            . . x x .
    x x x x x         . . . x x            . . . . x            . . . . x

``local_global_masks`` gives one mask per layer, several sliding-window (local) layers then
one global causal layer, as in Gemma 2/3's interleaving; chunked masks are Llama 4's
"chunked attention". Left out: additive float masks (ALiBi and friends) and document
masks built from sequence ids.

>>> causal_mask(3).int()
tensor([[1, 0, 0],
        [1, 1, 0],
        [1, 1, 1]], dtype=torch.int32)
>>> causal_mask(1, 3).int()   # one new query after two cached tokens sees all three
tensor([[1, 1, 1]], dtype=torch.int32)
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "causal_mask",
    "sliding_window_mask",
    "chunked_mask",
    "padding_mask",
    "local_global_masks",
    "combine_masks",
]


def _positions(S: int, Sk: int | None, device) -> tuple[Tensor, Tensor]:
    """Absolute positions of the queries, as a column, and of the keys, as a row."""
    Sk = S if Sk is None else Sk
    if S < 0 or Sk < S:
        raise ValueError(f"need 0 <= S <= Sk (queries are the last S of Sk positions), got S={S}, Sk={Sk}")
    q_pos = torch.arange(Sk - S, Sk, device=device)[:, None]  # (S, 1)
    k_pos = torch.arange(Sk, device=device)[None, :]  # (1, Sk)
    return q_pos, k_pos


def causal_mask(S: int, Sk: int | None = None, *, device=None) -> Tensor:
    """``(S, Sk)`` mask where a query at position p sees keys 0 .. p (chapter 02)."""
    q_pos, k_pos = _positions(S, Sk, device)
    return k_pos <= q_pos  # (S, 1), (1, Sk) -> (S, Sk)


def sliding_window_mask(S: int, window: int, Sk: int | None = None, *, device=None) -> Tensor:
    """Causal mask where a query at position p sees keys p - window + 1 .. p (itself included).

    >>> sliding_window_mask(4, 2).int()
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [0, 1, 1, 0],
            [0, 0, 1, 1]], dtype=torch.int32)
    """
    if window < 1:
        raise ValueError(f"window must be >= 1 (it counts the query itself), got {window}")
    q_pos, k_pos = _positions(S, Sk, device)
    return (k_pos <= q_pos) & (k_pos > q_pos - window)  # (S, Sk)


def chunked_mask(S: int, chunk: int, Sk: int | None = None, *, causal: bool = True, device=None) -> Tensor:
    """Block-diagonal mask: positions p and q interact only if ``p // chunk == q // chunk``.

    Causal within a chunk unless ``causal=False``. Chunks are cut at absolute positions, so a
    query at position 5 with ``chunk=4`` sees keys 4 and 5 only.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    q_pos, k_pos = _positions(S, Sk, device)
    mask = (q_pos // chunk) == (k_pos // chunk)  # (S, Sk)
    return mask & (k_pos <= q_pos) if causal else mask


def padding_mask(lengths: Tensor, Sk: int) -> Tensor:
    """``(B, 1, 1, Sk)`` mask, True at key positions ``< lengths[b]`` (right padding).

    >>> padding_mask(torch.tensor([2, 3]), 4).int().squeeze(1).squeeze(1)
    tensor([[1, 1, 0, 0],
            [1, 1, 1, 0]], dtype=torch.int32)
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > Sk):
        raise ValueError(f"lengths must lie in 0 .. Sk={Sk}, got {lengths.tolist()}")
    k_pos = torch.arange(Sk, device=lengths.device)  # (Sk,)
    return (k_pos[None, :] < lengths[:, None])[:, None, None, :]  # (B, Sk) -> (B, 1, 1, Sk)


def local_global_masks(S: int, n_layers: int, window: int, global_every: int, *, device=None) -> list[Tensor]:
    """One mask per layer: sliding-window layers, with every ``global_every``-th one global causal.

    Layer ``l`` (0-based) is global when ``(l + 1) % global_every == 0``; with ``global_every=3``::

        layer  0      1      2       3      4      5
               local  local  GLOBAL  local  local  GLOBAL

    Local layers see ``window`` tokens; the global ones carry information across the whole
    sequence, and only they need a KV cache as long as the context.
    """
    if n_layers < 1 or global_every < 1:
        raise ValueError(f"n_layers and global_every must be >= 1, got {n_layers} and {global_every}")
    local = sliding_window_mask(S, window, device=device)
    full = causal_mask(S, device=device)
    return [full if (layer + 1) % global_every == 0 else local for layer in range(n_layers)]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks, with broadcasting; None entries are skipped (all None -> None).

    >>> combine_masks(causal_mask(3), None, padding_mask(torch.tensor([2]), 3)).int()[0, 0]
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 0]], dtype=torch.int32)
    """
    out = None
    for m in masks:
        if m is None:
            continue
        if m.dtype != torch.bool:
            raise ValueError(f"masks must be bool (True = may attend), got dtype {m.dtype}")
        out = m if out is None else out & m  # broadcasts, e.g. (S, Sk) & (B, 1, 1, Sk) -> (B, 1, S, Sk)
    return out
