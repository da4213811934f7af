"""Count n-gram language models: the baseline a neural language model has to beat (chapter 03).

An n-gram model predicts the next token from the ``n - 1`` tokens before it, by counting how often
each continuation followed that context in the training text. Counts alone give probability 0 to
everything unseen, so each order is smoothed towards the order below it (interpolation with a
Dirichlet prior, MacKay and Peto 1995), down to the uniform distribution::

    p_0(c)        = 1 / V
    p_m(c | h)    = (count(h c) + k * p_{m-1}(c | h')) / (count(h) + k)      m = 1, ..., n

where ``h`` is the ``m - 1`` tokens before ``c``, ``h'`` is ``h`` without its oldest token, and
``count(h)`` counts ``h`` followed by any token, so ``sum_c count(h c) = count(h)`` and every
``p_m(. | h)`` sums to 1. A context seen often trusts its own counts; one seen rarely leans on the
shorter context; one never seen (``count(h) = 0``) is exactly the order below. One number ``k``
per order sets how much; :func:`tune_k` picks it on a held-out tail of the *training* tokens, so
the validation text is never looked at. With ``k = 0`` the unigram is ``count(c) / N``.

Hand-worked (``V = 3``, ``ids = [0, 1, 0, 1, 2]``, ``n = 2``, ``k = 1``): the unigram counts are
``(2, 2, 1)`` of 5, so ``p_1 = ((2 + 1/3) / 6, (2 + 1/3) / 6, (1 + 1/3) / 6)``; after token 0 the
bigram counts are ``(0, 2, 0)``, so ``p_2(1 | 0) = (2 + 7/18) / 3``.

>>> m = fit(torch.tensor([0, 1, 0, 1, 2]), n=2, vocab_size=3, k=1.0)
>>> round(probs(m, [0])[1].item(), 4), round(probs(m, [0]).sum().item(), 4)
(0.7963, 1.0)

Shapes: ``N`` tokens, ``V`` vocabulary, ``n`` the order (tokens in a gram, context ``n - 1``).
Counts are kept sparse: each m-gram is one integer (its tokens as digits in base ``V``), sorted,
and looked up with ``torch.searchsorted``, so a 4-gram over bytes (256**4 possible keys) costs
memory only for the grams that occur.

Left out: Kneser-Ney and other discounting schemes, sentence boundaries (the corpus is one
stream) and pruning.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["NGram", "fit", "probs", "log_probs", "cross_entropy", "tune_k"]


@dataclass(frozen=True)
class NGram:
    """A fitted model: for each order ``m = 1..n``, the sorted keys of the m-grams seen and their
    counts, and the same for their contexts (the first ``m - 1`` tokens of each m-gram)."""

    n: int                          # the order: the context is n - 1 tokens
    vocab_size: int                 # V
    k: float                        # the prior's weight: how strongly each order leans on the one below
    grams: list[tuple[torch.Tensor, torch.Tensor]]     # per order: (sorted keys, counts), int64
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # per order: (sorted context keys, counts)

    def distinct(self, m: int) -> int:
        """How many different m-grams (m <= n) the training text holds: the rows of that table."""
        return len(self.grams[m - 1][0])

    def order(self, n: int, k: float) -> NGram:
        """The n-gram model (``n <= self.n``) with weight ``k``, from the same counts: a 4-gram's
        tables hold the unigram's, bigram's and trigram's too."""
        if not 1 <= n <= self.n or k < 0:
            raise ValueError(f"need 1 <= n <= {self.n} and k >= 0; got n={n}, k={k}")
        return NGram(n, self.vocab_size, float(k), self.grams[:n], self.contexts[:n])


def _keys(ids: torch.Tensor, m: int, V: int) -> torch.Tensor:
    """The key of the m-gram ending at each position t >= m - 1: (N,) -> (N - m + 1,).

    >>> _keys(torch.tensor([1, 2, 3]), 2, 10).tolist()    # "12", "23" in base 10
    [12, 23]
    """
    key = torch.zeros(len(ids) - m + 1, dtype=torch.int64)
    for j in range(m):  # oldest token first: the most significant digit
        key = key * V + ids[j:len(ids) - m + 1 + j]
    return key


def _lookup(table: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor) -> torch.Tensor:
    """The count of each key in a (sorted keys, counts) table, 0 for keys it lacks."""
    seen, counts = table
    if len(seen) == 0:
        return torch.zeros_like(keys)
    i = torch.searchsorted(seen, keys).clamp(max=len(seen) - 1)
    return torch.where(seen[i] == keys, counts[i], 0)


def fit(ids: torch.Tensor, n: int, vocab_size: int, k: float) -> NGram:
    """Count the 1- to n-grams of ``ids`` (a (N,) tensor of token ids below ``vocab_size``)."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    if n < 1 or vocab_size < 1 or k < 0:
        raise ValueError(f"need n >= 1, vocab_size >= 1 and k >= 0; got n={n}, vocab_size={vocab_size}, "
                         f"k={k}")
    if vocab_size ** n >= 2**63:
        raise ValueError(f"vocab_size ** n = {vocab_size}**{n} does not fit the int64 keys")
    if ids.dim() != 1 or len(ids) < n or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"ids must be a 1-D tensor of at least n={n} ids in [0, {vocab_size}), got shape "
                         f"{tuple(ids.shape)}")
    grams, contexts = [], []
    for m in range(1, n + 1):
        keys, counts = torch.unique(_keys(ids, m, vocab_size), sorted=True, return_counts=True)  # m-grams
        # its context, the first m - 1 tokens, is key // V; sorted keys keep equal contexts together
        ctx, which = torch.unique_consecutive(keys // vocab_size, return_inverse=True)
        grams.append((keys, counts))
        n_h = torch.zeros_like(ctx).index_add_(0, which, counts)  # count(h) = sum_c count(h c)
        contexts.append((ctx, n_h))
    return NGram(n, vocab_size, float(k), grams, contexts)


def _counts_at(model: NGram, history: torch.Tensor, targets: torch.Tensor) -> list[tuple]:
    """For each order m = 1..n: (count(h c), count(h), whether the history is long enough), with h
    the last m - 1 tokens of each row of ``history`` (R, n - 1), oldest first, -1 before the start
    of the text, and c the row's target (R,)."""
    V, out = model.vocab_size, []
    ctx = torch.zeros_like(targets)  # the key of the last m - 1 tokens of the history
    known = torch.ones_like(targets, dtype=torch.bool)
    for m in range(1, model.n + 1):
        if m > 1:
            prev = history[:, -(m - 1)]  # the token m - 1 places back: the most significant digit
            known = known & (prev >= 0)
            ctx = ctx + prev.clamp(min=0) * V ** (m - 2)
        out.append((_lookup(model.grams[m - 1], ctx * V + targets).double(),
                    _lookup(model.contexts[m - 1], ctx).double(), known))
    return out


def _smoothed(counts: list[tuple], k: float, V: int) -> torch.Tensor:
    """p_n(c | h) from :func:`_counts_at`'s counts, order by order from the uniform p_0 = 1 / V."""
    p = torch.full(counts[0][0].shape, 1.0 / V, dtype=torch.float64)
    for n_hc, n_h, known in counts:
        denom = n_h + k
        p_m = (n_hc + k * p) / denom.clamp(min=1e-300)
        p = torch.where(known & (denom > 0), p_m, p)  # no history, or unseen with k = 0: the order below
    return p


def _history(model: NGram, ids: torch.Tensor) -> torch.Tensor:
    """The n - 1 tokens before each of ids[1:], oldest first, -1 before the start: (N,) -> (N - 1, n - 1)."""
    padded = torch.cat([torch.full((model.n - 1,), -1, dtype=torch.int64), ids])
    return padded.unfold(0, model.n - 1, 1)[1:len(ids)]  # row t - 1 holds ids[t - n + 1 : t]


def probs(model: NGram, context: Sequence[int]) -> torch.Tensor:
    """The (V,) distribution of the next token after ``context`` (only its last n - 1 tokens count)."""
    V = model.vocab_size
    h = ([-1] * (model.n - 1) + [int(c) for c in context])[-(model.n - 1):] if model.n > 1 else []
    history = torch.tensor(h, dtype=torch.int64).reshape(1, model.n - 1).expand(V, model.n - 1)
    return _smoothed(_counts_at(model, history, torch.arange(V)), model.k, V)


def log_probs(model: NGram, ids: torch.Tensor) -> torch.Tensor:
    """ln p(ids[t] | the n - 1 tokens before it) for t = 1, ..., N - 1 (the first tokens of ``ids``
    use the shorter history they have): (N,) -> (N - 1,), float64."""
    ids = torch.as_tensor(ids, dtype=torch.int64)
    counts = _counts_at(model, _history(model, ids), ids[1:])
    return _smoothed(counts, model.k, model.vocab_size).log()


def cross_entropy(model: NGram, ids: torch.Tensor) -> float:
    """Mean negative log-likelihood of ids[1:], in nats per token: comparable with the loss of a
    language model that predicts the same targets ``ids[1:]``."""
    return -log_probs(model, ids).mean().item()


GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # the values of k that tune_k tries


def tune_k(train_ids: torch.Tensor, n: int, vocab_size: int, grid: Sequence[float] = GRID,
           held_out: float = 0.1) -> list[float]:
    """For each order m = 1..n, the ``k`` of ``grid`` that predicts the last ``held_out`` of
    ``train_ids`` best when the counts come from the rest: a choice made on training tokens only
    (ties go to the smaller k). Returns ``[k_1, ..., k_n]``."""
    train_ids = torch.as_tensor(train_ids, dtype=torch.int64)
    cut = len(train_ids) - max(2, int(len(train_ids) * held_out))
    fitted, tail = fit(train_ids[:cut], n, vocab_size, 0.0), train_ids[cut:]
    counts = _counts_at(fitted, _history(fitted, tail), tail[1:])  # the same for every k and every order
    best = []
    for m in range(1, n + 1):
        losses = [-_smoothed(counts[:m], float(k), vocab_size).log().mean().item() for k in grid]
        best.append(float(grid[losses.index(min(losses))]))
    return best
