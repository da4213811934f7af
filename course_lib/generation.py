"""Decoding: greedy, temperature, top-k, top-p sampling and beam search (chapter 03).

Shapes: ``B`` batch, ``S`` prompt length, ``V`` vocabulary, ``W`` beams.

Sampling is rolling a V-sided die whose faces are weighted by ``softmax(logits / T)``:

* **greedy** takes the heaviest face (``T -> 0`` tends to it);
* **temperature** ``T`` flattens (``T > 1``) or sharpens (``T < 1``) the die;
* **top-k** keeps the k heaviest faces; **top-p** (nucleus; Holtzman et al., 2020) keeps the
  smallest set of heaviest faces whose probabilities add up to at least p;
* **beam search** keeps the W most likely *sequences* instead of one token at a time.

:func:`generate` works with any model called as ``model(idx, caches=...) -> (logits, _)`` with a
``config.context_length`` (a :class:`course_lib.model.GPT`). With ``use_cache=True`` it feeds the
prompt once, then one token per step (KV cache); without, it reruns the whole sequence each
step. The two give the same tokens for the same ``torch.Generator`` seed. When the sequence
outgrows ``context_length``, both continue on the last ``context_length`` tokens without a
cache (the learned positions would otherwise run out).

Prompts of different lengths share a batch by **left padding** (:func:`left_pad`): every
prompt ends in the last column, so each row's next token is read from ``logits[:, -1]`` and
new tokens append in one column for all rows. The ``padding_mask`` (True = real) travels
with the batch and grows by one True per new token; the model gives pads no attention and
numbers each row's positions from its first real token::

    idx            padding_mask      positions
    . . 5 6 7  ->  0 0 1 1 1         0 0 0 1 2      (. = pad_id)
    8 9 4 3 2      1 1 1 1 1         0 1 2 3 4

Left out: repetition penalties, min-p, speculative decoding, and a KV cache in beam search.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["top_k_filter", "top_p_filter", "sample_next", "left_pad", "generate", "beam_search"]


def top_k_filter(logits: Tensor, k: int | None) -> Tensor:
    """Set every logit below the k-th largest (per row) to ``-inf``; ``k=None`` keeps all.

    Ties with the k-th largest are kept, so a row may keep more than k.

    >>> top_k_filter(torch.tensor([1.0, 3.0, 2.0, 0.0]), 2)
    tensor([-inf, 3., 2., -inf])
    """
    if k is None:
        return logits
    if k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {k}")
    k = min(k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (..., V) -> (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float | None) -> Tensor:
    """Nucleus filter: keep the smallest set of top tokens whose probabilities sum to >= p.

    A token is dropped when the tokens ranked above it already hold >= p; the top token is
    always kept. ``p=None`` or ``p >= 1`` keeps all.

    >>> logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    >>> top_p_filter(logits, 0.8).exp()      # 0.5 < 0.8, 0.5 + 0.3 >= 0.8: keep two
    tensor([0.5000, 0.3000, 0.0000, 0.0000])
    """
    if p is None:
        return logits
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {p}")
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability held by the tokens ranked above
    drop_sorted = mass_before >= p  # rank 0 has mass_before 0 < p: always kept
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, greedy: bool = False,
                generator: torch.Generator | None = None) -> Tensor:
    """One token per row from ``(B, V)`` logits -> ``(B,)`` long.

    ``greedy`` (or ``temperature == 0``) is the argmax; otherwise divide by the temperature,
    apply top-k then top-p, and draw from the softmax with ``generator``.

    >>> sample_next(torch.tensor([[0.0, 5.0, 1.0]]), greedy=True)
    tensor([1])
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (B, V), got shape {tuple(logits.shape)}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if greedy or temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    scaled = top_p_filter(top_k_filter(scaled, top_k), top_p)
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    # A CPU generator for a model on a GPU draws on the CPU: a seed picks the same tokens on any
    # device (up to float differences in probs).
    where = probs.device if generator is None else generator.device
    return torch.multinomial(probs.to(where), 1, generator=generator).squeeze(-1).to(probs.device)  # (B,)


def left_pad(prompts, pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Stack prompts of different lengths, padded on the left -> ``(idx, padding_mask)``.

    ``prompts``: a list of 1-D long tensors or lists of ints. Returns ``idx (B, S)`` long and
    ``padding_mask (B, S)`` bool, True at real tokens, with ``S`` the longest prompt's length.
    ``pad_id`` only has to be a valid token id: the model never attends to pads.

    >>> idx, mask = left_pad([[5, 6, 7], [8]])
    >>> idx
    tensor([[5, 6, 7],
            [0, 0, 8]])
    >>> mask
    tensor([[ True,  True,  True],
            [False, False,  True]])
    """
    if len(prompts) == 0:
        raise ValueError("left_pad needs at least one prompt, got an empty list")
    rows = [torch.as_tensor(p, dtype=torch.long) for p in prompts]
    bad = [i for i, r in enumerate(rows) if r.dim() != 1 or r.numel() == 0]
    if bad:
        raise ValueError(f"every prompt must be a non-empty 1-D sequence of token ids; prompts {bad} "
                         f"are not (shapes {[tuple(rows[i].shape) for i in bad]})")
    B, S = len(rows), max(len(r) for r in rows)
    idx = torch.full((B, S), pad_id, dtype=torch.long, device=rows[0].device)
    padding_mask = torch.zeros(B, S, dtype=torch.bool, device=rows[0].device)
    for b, r in enumerate(rows):
        idx[b, S - len(r):] = r  # right-aligned: every prompt ends in the last column
        padding_mask[b, S - len(r):] = True
    return idx, padding_mask


def _check_prompt(idx: Tensor, max_new_tokens: int) -> None:
    if not isinstance(idx, Tensor) or idx.dim() != 2 or idx.dtype != torch.long or idx.shape[1] < 1:
        raise ValueError(f"idx must be a non-empty (B, S) long tensor, got "
                         f"{tuple(idx.shape) if isinstance(idx, Tensor) else type(idx)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")


def _device_of(model, idx: Tensor) -> torch.device:
    """The device of the model's parameters (the prompt's if it has none)."""
    param = next(model.parameters(), None)
    return idx.device if param is None else param.device


def _check_padding_mask(idx: Tensor, padding_mask: Tensor) -> None:
    if not (isinstance(padding_mask, Tensor) and padding_mask.dtype == torch.bool
            and padding_mask.shape == idx.shape):
        got = (f"shape {tuple(padding_mask.shape)}, dtype {padding_mask.dtype}"
               if isinstance(padding_mask, Tensor) else type(padding_mask))
        raise ValueError(f"padding_mask must be a bool tensor of idx's shape {tuple(idx.shape)} "
                         f"(True = real token), got {got}")
    if not bool(padding_mask[:, -1].all()):
        raise ValueError("padding_mask must be True in the last column: pad prompts on the left "
                         "(left_pad), so that every prompt ends where generation continues")


def _padding_kw(padding_mask: Tensor | None, start: int = 0) -> dict:
    """``{}`` without a mask, so that models with no ``padding_mask`` keyword keep working."""
    return {} if padding_mask is None else {"padding_mask": padding_mask[:, start:]}


@torch.no_grad()
def generate(model, idx: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, greedy: bool = False,
             stop_tokens=None, use_cache: bool = True, generator: torch.Generator | None = None,
             padding_mask: Tensor | None = None) -> Tensor:
    """Extend every prompt in ``idx (B, S)`` by up to ``max_new_tokens`` tokens -> ``(B, S + n)``.

    Once a row emits a token from ``stop_tokens``, it is padded with that same token; the loop
    ends early when every row has stopped (so ``n <= max_new_tokens``). Prompts of different
    lengths come left-padded with their ``padding_mask (B, S)`` (from :func:`left_pad`); the
    model must then take a ``padding_mask`` keyword, as :class:`course_lib.model.GPT` does. The
    pads stay in the result: row ``b`` without them is ``out[b, int((~padding_mask[b]).sum()):]``.
    The prompt moves to the model's device, where the result stays. The model runs in eval
    mode and is put back as it was.
    """
    _check_prompt(idx, max_new_tokens)
    idx = idx.to(_device_of(model, idx))
    if padding_mask is not None:
        _check_padding_mask(idx, padding_mask)
        padding_mask = padding_mask.to(idx.device)
    C = model.config.context_length
    stops = torch.tensor(sorted(set(stop_tokens or ())), dtype=torch.long, device=idx.device)
    stopped = torch.full((idx.shape[0],), -1, dtype=torch.long, device=idx.device)  # -1: still running
    caches = model.make_caches(idx.shape[0]) if use_cache else None
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            n_new = idx.shape[1] - (caches[0].length if caches else 0)
            if caches is not None and caches[0].length + n_new > C:
                caches = None  # out of positions: continue on a sliding window, no cache
            if caches is not None:  # the mask covers every key: cached and new
                kw = _padding_kw(padding_mask)
                logits, _ = model(idx[:, -n_new:], caches=caches, **kw)  # (B, n_new) -> (B, n_new, V)
            else:  # the window's mask is the mask's window
                kw = _padding_kw(padding_mask, -C)
                logits, _ = model(idx[:, -C:], **kw)  # (B, min(S, C)) -> (B, min(S, C), V)
            nxt = sample_next(logits[:, -1], temperature, top_k, top_p, greedy, generator)  # (B,)
            nxt = torch.where(stopped >= 0, stopped, nxt)  # stopped rows repeat their stop token
            idx = torch.cat([idx, nxt[:, None]], dim=1)  # (B, S) -> (B, S + 1)
            if padding_mask is not None:  # new tokens are real
                padding_mask = torch.cat([padding_mask, padding_mask.new_ones(idx.shape[0], 1)], dim=1)
            if stops.numel():
                stopped = torch.where((stopped < 0) & torch.isin(nxt, stops), nxt, stopped)
                if bool((stopped >= 0).all()):
                    break
    finally:
        model.train(was_training)
    return idx


@torch.no_grad()
def beam_search(model, idx: Tensor, max_new_tokens: int, beam_width: int, *,
                length_penalty: float = 1.0, stop_tokens=None) -> Tensor:
    """The most likely continuation of one prompt ``idx (1, S)`` found by beam search -> ``(1, S + n)``.

    Keeps the ``beam_width`` best partial sequences by summed log-probability. A beam that
    emits a stop token is finished (the stop token is kept); the search ends when
    ``beam_width`` beams have finished or after ``max_new_tokens`` steps, and returns the
    finished or surviving sequence with the best ``sum_logprob / n_new ** length_penalty``
    (``length_penalty = 0``: raw sums, which favour short sequences; 1: mean per token).
    Batch size 1 only, and every step reruns the full forward on the ``W`` beams (no cache).
    ``beam_width = 1`` is greedy decoding. The prompt moves to the model's device.
    """
    _check_prompt(idx, max_new_tokens)
    idx = idx.to(_device_of(model, idx))
    if idx.shape[0] != 1:
        raise ValueError(f"beam_search takes one prompt (batch size 1), got batch size {idx.shape[0]}")
    if beam_width < 1:
        raise ValueError(f"beam_width must be >= 1, got {beam_width}")
    C, S = model.config.context_length, idx.shape[1]
    stops = set(stop_tokens or ())
    beams, scores = idx, torch.zeros(1, device=idx.device)  # (W, S + t), (W,) summed log-probs
    finished: list[tuple[float, Tensor]] = []  # (normalised score, sequence (S + n,))

    def normalised(score: float, seq_len: int) -> float:
        return score / max(seq_len - S, 1) ** length_penalty

    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            logits, _ = model(beams[:, -C:])  # (W, S + t) -> (W, S + t, V)
            logp = torch.log_softmax(logits[:, -1].float(), dim=-1)  # (W, V)
            V = logp.shape[-1]
            total = (scores[:, None] + logp).flatten()  # (W * V,) score of every one-token extension
            cand = torch.topk(total, min(beam_width + len(stops), total.numel()))
            keep_rows, keep_scores = [], []
            for score, flat in zip(cand.values.tolist(), cand.indices.tolist(), strict=True):
                seq = torch.cat([beams[flat // V], beams.new_tensor([flat % V])])  # (S + t + 1,)
                if flat % V in stops:
                    finished.append((normalised(score, len(seq)), seq))
                elif len(keep_rows) < beam_width:
                    keep_rows.append(seq)
                    keep_scores.append(score)
                if len(keep_rows) == beam_width:
                    break
            if len(finished) >= beam_width or not keep_rows:
                break
            beams, scores = torch.stack(keep_rows), torch.tensor(keep_scores, device=idx.device)
        else:  # ran out of steps: the surviving beams compete with the finished ones
            finished += [(normalised(s, beams.shape[1]), b)
                         for s, b in zip(scores.tolist(), beams, strict=True)]
    finally:
        model.train(was_training)
    if not finished:  # max_new_tokens == 0 or every candidate was a stop token at step 0
        return idx
    best = max(finished, key=lambda pair: pair[0])
    return best[1][None]  # (S + n,) -> (1, S + n)
