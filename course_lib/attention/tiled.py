"""Tiled attention with an online softmax: FlashAttention's forward pass, written out (chapter 02).

Milakov and Gimelshein (2018), "Online normalizer calculation for softmax", compute a softmax's
denominator in one pass: keep the largest entry seen so far, ``m``, and the sum of
``exp(x - m)``, ``l``; when a new entry raises the maximum, multiply ``l`` by
``exp(m_old - m_new)`` first. Dao et al. (2022), "FlashAttention", carry the weighted sum of the
values along in the same way, so attention runs over blocks of keys and values and never holds
the ``(S, Sk)`` matrix of scores. Per query row (shapes: ``S`` queries, ``Sk`` keys, ``b`` the
block, ``Dv`` the value width)::

    m = -inf, l = 0, acc = 0                     m, l: (S, 1)   acc: (S, Dv)
    for each block j of keys/values (the last one may be shorter):
        s     = q k_j^T / sqrt(Dh)               (S, b)   the only scores alive
        m_new = max(m, rowmax(s))
        alpha = exp(m - m_new)                   (S, 1)   rescales what was summed under the old max
        p     = exp(s - m_new)                   (S, b)
        l     = alpha * l + rowsum(p)
        acc   = alpha * acc + p v_j              (S, Dv)
        m     = m_new
    out = acc / l

Memory per (batch, head): ``O(S * b + S * Dv)`` instead of ``O(S * Sk)``. The naive equivalent is
:func:`course_lib.attention.scaled_dot_product_attention` (``impl="naive"``), which forms the whole
``(S, Sk)`` matrix.

:class:`TensorWatch` (``with watch_tensors() as w: ...``) measures that claim: it records every
tensor a torch operation creates while it is active, the largest one and the peak of the bytes
such tensors hold at the same time.

Left out: tiling the queries as well (FlashAttention-2's outer loop), the backward pass (which
recomputes each block from ``m`` and ``l``; autograd here keeps every block's ``p``), dropout, and
the GPU kernel that makes it fast: the point of this version is the memory.
"""

from __future__ import annotations

import math
import sys
import weakref

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from .core import _check_inputs, broadcast_shape

__all__ = ["tiled_attention", "TensorWatch", "watch_tensors"]


def tiled_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, *, block: int = 64,
                    causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale, masked) v one key block at a time, never forming the (S, Sk) scores.

    q ``(..., S, Dh)``, k ``(..., Sk, Dh)``, v ``(..., Sk, Dv)`` -> ``(..., S, Dv)``, the
    leading axes broadcasting as in :func:`scaled_dot_product_attention`. ``block``: keys per
    block (need not divide ``Sk``). ``causal``: query ``i`` sees key ``j`` only if
    ``j <= Sk - S + i`` (the queries are the last ``S`` of the ``Sk`` positions, as in
    ``causal_mask(S, Sk)``). ``mask``: bool, True = may attend, broadcastable to
    ``(..., S, Sk)``; it is sliced per block. A query that may see no key gets a zero output.
    Computes in float32, or float64 for float64 inputs, and returns q's dtype.

    >>> q = torch.tensor([[1.0, 0.0]]); k = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> v = torch.tensor([[1.0], [2.0], [3.0]])    # scores [a, 0, a]: weights [w, 1, w] / (2w + 1)
    >>> round(tiled_attention(q, k, v, block=2).item(), 4)   # blocks [k0, k1] and [k2]
    2.0
    """
    _check_inputs(q, k, v, mask)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    S, Sk, Dh, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if causal and Sk < S:
        raise ValueError(f"causal attention needs Sk >= S (the queries are the last S of Sk positions), "
                         f"got S={S}, Sk={Sk}")
    scale = 1.0 / math.sqrt(Dh) if scale is None else scale
    dtype = q.dtype
    work = torch.promote_types(q.dtype, torch.float32)  # float64 stays, bf16/fp16 compute in fp32
    lead = broadcast_shape(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = q.to(work) * scale  # scale the queries once instead of every block of scores
    m = torch.full((*lead, S, 1), float("-inf"), dtype=work, device=q.device)  # running max
    denom = torch.zeros((*lead, S, 1), dtype=work, device=q.device)  # l: running sum of exp(s - m)
    acc = torch.zeros((*lead, S, Dv), dtype=work, device=q.device)  # running sum of exp(s - m) v
    query_pos = torch.arange(Sk - S, Sk, device=q.device)[:, None]  # (S, 1): absolute positions

    for start in range(0, Sk, block):
        end = min(start + block, Sk)  # the last block is shorter when block does not divide Sk
        k_j, v_j = k[..., start:end, :].to(work), v[..., start:end, :].to(work)  # (..., b, Dh), (..., b, Dv)
        s = q @ k_j.transpose(-2, -1)  # (..., S, Dh) @ (..., Dh, b) -> (..., S, b)
        allowed = None
        if causal:
            allowed = torch.arange(start, end, device=q.device)[None, :] <= query_pos  # (S, b)
        if mask is not None:
            part = mask[..., start:end]  # (..., S or 1, b)
            allowed = part if allowed is None else allowed & part
        if allowed is not None:
            s = s.masked_fill(~allowed, float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., S, 1)
        # A row that has seen no allowed key yet keeps m = -inf: shift it by 0, so that exp gives 0,
        # not exp(-inf - (-inf)) = nan.
        shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # (..., S, 1)
        alpha = torch.exp(m - shift)  # (..., S, 1): 0 before the first allowed key, <= 1 after
        p = torch.exp(s - shift)  # (..., S, b): unnormalised weights of this block
        denom = alpha * denom + p.sum(dim=-1, keepdim=True)  # (..., S, 1)
        acc = alpha * acc + p @ v_j  # (..., S, Dv) + (..., S, b) @ (..., b, Dv)
        m = m_new

    out = acc / denom.masked_fill(denom == 0, 1.0)  # a row that saw no key: 0 / 1 = 0
    return out.to(dtype)  # (..., S, Dv)


class TensorWatch(TorchDispatchMode):
    """While active, records the tensors that torch operations create (chapter 02).

    ``largest``: the number of elements of the biggest one; ``peak_bytes``: the most bytes held
    at one time by tensors created while watching and still alive; ``at_peak``: those tensors, as
    ``(operation, shape, dtype)``, largest first; ``ops``: the names of the
    operations that ran, and of the torch functions called from Python. A view or an in-place
    result shares an input's memory and is not counted; tensors that existed before are not
    counted. It sees what operations return, not the scratch memory inside a fused kernel, the
    Python objects around the tensors, or what the allocator keeps cached.

    >>> with watch_tensors() as w:
    ...     x = torch.zeros(1000)       # 4,000 bytes
    ...     y = x + 1                   # 4,000 more
    ...     del y                       # freed
    ...     z = x[:10] * 2              # the view x[:10] is x's memory; z is 40 bytes
    >>> w.largest, w.peak_bytes
    (1000, 8000)
    >>> w.at_peak
    [('aten.zeros', (1000,), torch.float32), ('aten.add', (1000,), torch.float32)]
    """

    def __init__(self):
        super().__init__()
        self.largest, self.peak_bytes, self.ops = 0, 0, set()
        self.at_peak: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        # storage id -> (bytes, (operation, shape, dtype)), for storages created while watching
        self._live: dict[int, tuple[int, tuple]] = {}
        self._now = 0
        self._previous_profile = None

    # A dispatch mode can be taken off torch's stack by the code it watches; a profile hook sees
    # each torch function called from Python whatever the modes, so ``ops`` also holds those
    # (``torch._C._nn.scaled_dot_product_attention``): a fused kernel is seen either way.
    def __enter__(self):
        self._previous_profile = sys.getprofile()
        sys.setprofile(self._profile)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            sys.setprofile(self._previous_profile)

    def _profile(self, frame, event, arg):
        if event == "c_call" and str(getattr(arg, "__module__", None) or "").startswith("torch"):
            self.ops.add(f"{arg.__module__}.{getattr(arg, '__name__', '?')}")
        if self._previous_profile is not None:
            self._previous_profile(frame, event, arg)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name, aliases = _op_info(func)
        self.ops.add(name)
        if aliases:  # a view, an in-place or an out= operation: its result is an input's memory
            return out
        for t in [out] if isinstance(out, Tensor) else _tensors(out):
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self._live:
                continue
            self.largest = max(self.largest, t.numel())
            self._live[key] = (storage.nbytes(), (name, tuple(t.shape), t.dtype))
            self._now += storage.nbytes()
            if self._now > self.peak_bytes:
                self.peak_bytes = self._now
                self.at_peak = [what for _, what in sorted(self._live.values(), key=lambda e: -e[0])]
            weakref.finalize(storage, self._freed, key)  # runs when torch frees the storage
        return out

    def _freed(self, key: int) -> None:
        self._now -= self._live.pop(key, (0, None))[0]


_OP_INFO: dict = {}


def _op_info(func) -> tuple[str, bool]:
    """(``"aten.mm"``, whether a result shares an argument's memory), from the operation's schema
    (cached: it is asked for every operation)."""
    info = _OP_INFO.get(func)
    if info is None:
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        info = _OP_INFO[func] = (str(func.overloadpacket), aliases)
    return info


def _tensors(obj):
    """The tensors in an operation's results: nested tuples and lists."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)


def watch_tensors() -> TensorWatch:
    """``with watch_tensors() as w: ...``, then ``w.largest``, ``w.peak_bytes``, ``w.ops``."""
    return TensorWatch()
