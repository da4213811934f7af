"""Scaled dot-product attention, naive and fused, and attention as kernel regression (chapter 02).

Shapes: ``B`` batch, ``H`` query heads, ``Hkv`` key/value heads, ``S`` queries, ``Sk`` keys,
``Dh`` head dim. Follows Vaswani et al. (2017), "Attention is all you need":

    Attention(Q, K, V) = softmax(Q K^T / sqrt(Dh) + mask) V

Two paths, one answer (a test checks they agree, values and gradients):

* ``impl="naive"``: the formula written out, softmax in fp32, returns the weights if asked;
* ``impl="sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels).
  ``is_causal=True`` (instead of a mask, ``S == Sk``) lets the kernel skip the masked half
  instead of reading a materialised mask; the model passes it for plain causal attention.

A query row whose mask allows *no* key (say a padded query under a padding and causal mask)
gives a zero output and zero gradients on both paths, never NaN: softmax over all -inf is
0/0, so such rows are unmasked for the softmax and multiplied by 0 afterwards. Nothing here
reads a tensor's values on the host (no ``.item()``, ``bool(t)`` or ``torch.equal``), so on a
GPU an attention call never waits for the device: the rows are found and fixed on the device.

``repeat_kv`` expands grouped key/value heads for GQA (see ``multihead``);
``nadaraya_watson`` is the Gaussian-kernel regression that attention generalises. Left out:
attention dropout beyond a plain ``dropout_p``, ALiBi, soft-capping, sinks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["scaled_dot_product_attention", "repeat_kv", "nadaraya_watson"]

IMPLS = ("naive", "sdpa")


def broadcast_shape(*shapes) -> tuple[int, ...]:
    """The shape that ``shapes`` broadcast to, by torch's rules (as ``torch.broadcast_shapes``,
    whose first call imports sympy: 0.35 s in every fresh process); ValueError if they do not.

    >>> broadcast_shape((2, 1, 4), (3, 1), ())
    (2, 3, 4)
    """
    rank = max(map(len, shapes), default=0)
    out = []
    for sizes in zip(*[(1,) * (rank - len(shape)) + tuple(shape) for shape in shapes], strict=True):
        other = set(sizes) - {1}
        if len(other) > 1:
            raise ValueError(f"shapes {[tuple(shape) for shape in shapes]} do not broadcast")
        out.append(other.pop() if other else 1)
    return tuple(out)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"q, k, v must have the same rank >= 2 (..., S, Dh), got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"need q (..., S, Dh), k (..., Sk, Dh), v (..., Sk, Dv), got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got dtype {mask.dtype}")
    scores_shape = (*broadcast_shape(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    try:
        ok = broadcast_shape(mask.shape, scores_shape) == scores_shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                         f"shape {scores_shape} (..., S, Sk)")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *,
                                 is_causal: bool = False, impl: str = "naive", scale: float | None = None,
                                 return_weights: bool = False, dropout_p: float = 0.0):
    """softmax(q k^T * scale, masked) v, for q (B, H, S, Dh), k (B, H, Sk, Dh), v (B, H, Sk, Dv).

    Any leading dims work as long as they broadcast. ``mask``: bool, True = may attend,
    broadcastable to ``(B, H, S, Sk)``; or ``is_causal=True`` for the causal mask of ``S == Sk``
    without building it (no mask then). ``scale`` defaults to ``1 / sqrt(Dh)``. Returns
    ``out`` (B, H, S, Dv), or ``(out, weights)`` with weights (B, H, S, Sk) when
    ``return_weights`` (naive path only). ``dropout_p`` drops attention weights (training).

    >>> q = torch.tensor([[1.0, 0.0]]); k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> v = torch.tensor([[10.0], [20.0]])
    >>> out, w = scaled_dot_product_attention(q, k, v, scale=math.log(3), return_weights=True)
    >>> w, out   # weights e^{ln 3} : e^0 = 3 : 1
    (tensor([[0.7500, 0.2500]]), tensor([[12.5000]]))
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if return_weights and impl != "naive":
        raise ValueError(f"return_weights=True needs impl='naive' (fused kernels never form the "
                         f"weights), got impl={impl!r}")
    _check_inputs(q, k, v, mask)
    S, Sk, Dh = q.shape[-2], k.shape[-2], q.shape[-1]
    if is_causal and (mask is not None or S != Sk):
        raise ValueError(f"is_causal=True takes no mask and needs as many queries as keys, got "
                         f"{'a mask' if mask is not None else 'no mask'} and S={S}, Sk={Sk}")
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale

    # Rows with no allowed key: let them attend everywhere, then zero them (no 0/0 = NaN). Found
    # on the device whether or not there are any (testing for them first would wait for it).
    keep = None
    if mask is not None:
        keep = mask.any(-1, keepdim=True)  # (..., S, Sk) -> (..., S, 1)
        mask = mask | ~keep  # fully masked rows become fully open

    if impl == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                             dropout_p=dropout_p)
        return out if keep is None else out * keep  # (..., S, Dv)
    if is_causal:  # no row is fully masked
        mask = torch.ones(S, Sk, dtype=torch.bool, device=q.device).tril()  # (S, Sk)

    # At most two (..., S, Sk) tensors are alive at once (chapter 02 measures it): the scores,
    # scaled through q and masked in place, and the weights the softmax writes from them.
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., S, Dh) @ (..., Dh, Sk) -> (..., S, Sk)
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))  # the matmul's backward does not need its output
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # softmax in fp32, cast back
    del scores  # the softmax's backward keeps its output, not its input
    if keep is not None:
        weights = weights * keep  # fully masked rows -> all-zero weights
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = weights @ v  # (..., S, Sk) @ (..., Sk, Dv) -> (..., S, Dv)
    return (out, weights) if return_weights else out


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Repeat each key/value head for its group of ``n_rep`` query heads (GQA).

    ``(B, Hkv, S, Dh) -> (B, Hkv * n_rep, S, Dh)``, the same as
    ``torch.repeat_interleave(x, n_rep, dim=1)`` but as a view plus one copy::

        kv heads:     k0        k1
        query heads:  q0 q1 q2  q3 q4 q5      (n_rep = G = 3)

    >>> repeat_kv(torch.tensor([10.0, 20.0]).view(1, 2, 1, 1), 3).flatten().tolist()
    [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]
    """
    if x.dim() != 4:
        raise ValueError(f"repeat_kv expects (B, Hkv, S, Dh), got shape {tuple(x.shape)}")
    if n_rep < 1:
        raise ValueError(f"n_rep must be >= 1, got {n_rep}")
    if n_rep == 1:
        return x
    B, Hkv, S, Dh = x.shape
    x = x[:, :, None].expand(B, Hkv, n_rep, S, Dh)  # (B, Hkv, S, Dh) -> (B, Hkv, G, S, Dh)
    return x.reshape(B, Hkv * n_rep, S, Dh)  # (B, Hkv, G, S, Dh) -> (B, H, S, Dh)


def nadaraya_watson(queries: Tensor, keys: Tensor, values: Tensor, bandwidth: float = 1.0, *,
                    return_weights: bool = False):
    """Nadaraya-Watson kernel regression (1964) with a Gaussian kernel of width ``bandwidth`` h.

    ``out_i = sum_j w_ij values_j`` with ``w_ij = exp(-|q_i - k_j|^2 / (2 h^2)) / sum_j' (...)``;
    queries (..., S, d), keys (..., Sk, d), values (..., Sk, dv) -> (..., S, dv).

    Attention is this with a learned similarity: expanding the square,
    ``-|q - k|^2 / (2h^2) = q.k / h^2 - |q|^2 / (2h^2) - |k|^2 / (2h^2)``; the |q| term cancels
    in the normalisation, so when all keys have the same norm the weights are exactly
    ``softmax(q.k / h^2)``, scaled dot-product attention with ``scale = 1 / h^2``.

    >>> nadaraya_watson(torch.tensor([[0.0]]), torch.tensor([[-1.0], [1.0]]), torch.tensor([[0.0], [4.0]]))
    tensor([[2.]])
    """
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    if queries.shape[-1] != keys.shape[-1] or keys.shape[-2] != values.shape[-2]:
        raise ValueError(f"need queries (..., S, d), keys (..., Sk, d), values (..., Sk, dv), got "
                         f"{tuple(queries.shape)}, {tuple(keys.shape)}, {tuple(values.shape)}")
    diff = queries[..., :, None, :] - keys[..., None, :, :]  # -> (..., S, Sk, d) by broadcasting
    sq_dist = (diff.float() ** 2).sum(-1)  # (..., S, Sk, d) -> (..., S, Sk)
    weights = torch.softmax(-sq_dist / (2 * bandwidth**2), dim=-1).to(values.dtype)  # (..., S, Sk)
    out = weights @ values  # (..., S, Sk) @ (..., Sk, dv) -> (..., S, dv)
    return (out, weights) if return_weights else out
