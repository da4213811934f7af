"""Count n-gram language models: the baselines a neural language model has to beat (chapter 03).

An n-gram model predicts the next token from the ``n - 1`` tokens before it, by counting how often
each continuation followed that context in the training text. Counts alone give probability 0 to
everything unseen, so each order is smoothed towards the order below it, down to the uniform
distribution ``p_0(c) = 1 / V``. ``h`` is the ``m - 1`` tokens before ``c``, ``h'`` is ``h``
without its oldest token. Two smoothings share the counting and the scoring functions.

**Add-k**, :func:`fit` (interpolation with a Dirichlet prior, MacKay and Peto 1995), one weight
``k_m`` per level::

    p_m(c | h) = (count(h c) + k_m * p_{m-1}(c | h')) / (count(h) + k_m)      m = 1, ..., n

``count(h)`` counts ``h`` followed by any token, so ``sum_c count(h c) = count(h)`` and every
``p_m(. | h)`` sums to 1. A context seen often trusts its own counts; one seen rarely leans on the
shorter context; one never seen (``count(h) = 0``) is exactly the order below. :func:`tune_k` picks
``k_1``, then ``k_2`` with ``k_1`` fixed, and so on, on a held-out tail of the *training* tokens,
so the validation text is never looked at. With ``k_1 = 0`` the unigram is ``count(c) / N``.

Hand-worked (``V = 3``, ``ids = [0, 1, 0, 1, 2]``, ``n = 2``, ``k_1 = 3``, ``k_2 = 1``): the
unigram counts are ``(2, 2, 1)`` of 5, so ``p_1 = ((2 + 1) / 8, (2 + 1) / 8, (1 + 1) / 8)``; after
token 0 the bigram counts are ``(0, 2, 0)``, so ``p_2(1 | 0) = (2 + 1 * 3/8) / (2 + 1) = 19/24``.

>>> m = fit(torch.tensor([0, 1, 0, 1, 2]), n=2, vocab_size=3, k=(3.0, 1.0))
>>> round(probs(m, [0])[1].item(), 4), round(probs(m, [0]).sum().item(), 4)
(0.7917, 1.0)

**Interpolated modified Kneser-Ney**, :func:`kneser_ney` (Kneser and Ney 1995; Chen and Goodman
1998; as KenLM's ``lmplz`` estimates it, Heafield et al. 2013, without pruning), subtracts a
discount from every count seen and hands the mass it frees to the order below::

    p_m(c | h) = max(a(h c) - D_m(a(h c)), 0) / a(h) + gamma(h) * p_{m-1}(c | h')
    gamma(h)   = (D_m1 * N_1(h .) + D_m2 * N_2(h .) + D_m3+ * N_3+(h .)) / a(h)

The top order counts as usual, ``a(h c) = count(h c)``. A lower order is only leant on when the
longer context is rare, so it counts *continuations*: ``a(h c) = N_1+(. h c)``, how many distinct
tokens come just before ``h c`` in the text (the start of the text counts as one more, as KenLM's
``<s>`` would). ``a(h) = sum_c a(h c)``; ``N_i(h .)`` is how many ``c`` have ``a(h c) = i`` (3+: at
least 3); a history never seen (``a(h) = 0``) is the order below, and the unigram leans on
``1 / V``, so every token, even one never seen, keeps some probability. Each order's discounts come
from its count-of-counts ``t_i`` (how many of its m-grams have ``a = i``): ``Y = t1 / (t1 + 2 t2)``,
``D1 = 1 - 2 Y t2 / t1``, ``D2 = 2 - 3 Y t3 / t2``, ``D3+ = 3 - 4 Y t4 / t3``. Where a ``t_i`` is
0 or a discount lands outside ``[0, i]`` (tiny texts), that order uses KenLM's
``--discount_fallback`` values ``(0.5, 1, 1.5)`` instead (``model.discounts`` shows each level's).
That also happens where no gram is rare: over bytes, every byte of a long text occurs more than
three times, so the unigram of real counts (``n = 1``) has no ``t1``.

Hand-worked in ``tests/lib/test_ngram.py`` (``V = 4``, the text ``0 0 0 0 0 1 0 1 0 1 1 2``,
``n = 2``): after token 1 the bigram counts ``(2, 1, 1, 0)`` lose ``(1/2, 1/2, 1/2, 0)``, so
``gamma(1) = 3/8`` and ``p_2(0 | 1) = (2 - 1/2) / 4 + 3/8 * p_1(0) = 3/8 + 3/8 * 13/72 = 255/576``.

>>> kn = kneser_ney(torch.tensor([0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 2]), n=2, vocab_size=4)
>>> round(probs(kn, [1])[0].item() * 576, 6), round(probs(kn, [1]).sum().item(), 4)
(255.0, 1.0)

Both are scored the same way: :func:`probs`, :func:`log_probs` (the first tokens of a text use the
shorter history they have) and :func:`cross_entropy`.

Shapes: ``N`` tokens, ``V`` vocabulary, ``n`` the order (tokens in a gram, context ``n - 1``).
Counts are kept sparse. The ``A`` distinct tokens of the training text get the codes ``1..A`` and
every other token the code 0 ("any other token", never counted), and each m-gram is one integer,
its codes as digits in base ``A + 1``, sorted and looked up with ``torch.searchsorted``: 8-grams
over the 69 bytes of chapter 03's training text need keys below ``70**8`` (about ``2**49``), not
``256**8 = 2**64``, and memory only for the grams that occur.

Left out: sentence boundaries (the corpus is one stream), pruning, and other smoothings
(Witten-Bell, Good-Turing, Katz back-off).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["NGram", "KneserNey", "fit", "kneser_ney", "probs", "log_probs", "cross_entropy", "tune_k"]

FALLBACK = (0.5, 1.0, 1.5)  # KenLM's --discount_fallback: D1, D2, D3+ where the formula fails


@dataclass(frozen=True)
class _Counts:
    """What both models hold: for each order ``m = 1..n``, the sorted keys of the m-grams seen in
    the training text and their counts."""

    n: int                   # the order: the context is n - 1 tokens
    vocab_size: int          # V
    alphabet: torch.Tensor   # (A,) the sorted token ids of the training text: codes 1..A; 0 is any other
    grams: list[tuple[torch.Tensor, torch.Tensor]]  # per order: (sorted keys, counts), int64

    def distinct(self, m: int) -> int:
        """How many different m-grams (m <= n) the training text holds: the rows of that table."""
        return len(self.grams[m - 1][0])


@dataclass(frozen=True)
class NGram(_Counts):
    """An add-k model: the counts, one weight per level, and the counts of the contexts (the first
    ``m - 1`` tokens of each m-gram)."""

    ks: tuple[float, ...]    # (k_1, ..., k_n): how strongly each level leans on the one below
    contexts: list[tuple[torch.Tensor, torch.Tensor]]  # per order: (sorted context keys, count(h))

    def order(self, n: int, k: float | Sequence[float]) -> NGram:
        """The n-gram model (``n <= self.n``) with weights ``k`` (one for every level, or ``k_1..k_n``),
        from the same counts: a 4-gram's tables hold the unigram's, bigram's and trigram's too."""
        _check_order(n, self.n)
        return NGram(n, self.vocab_size, self.alphabet, self.grams[:n], _per_level(k, n), self.contexts[:n])


@dataclass(frozen=True)
class KneserNey(_Counts):
    """An interpolated modified Kneser-Ney model: the counts, the continuation counts of the lower
    orders, and per level its discounts and the two tables the scoring looks up."""

    continuation: list[torch.Tensor]  # per order m < n: (K_m,) N_1+(. g) for each key of grams[m - 1]
    discounts: list[tuple[float, float, float]]  # per level: (D1, D2, D3+)
    levels: list[tuple]  # per level: ((K,) gram keys, (K,) max(a - D, 0) / a(h)), ((H,) contexts, (H,) gamma)

    def order(self, n: int) -> KneserNey:
        """The Kneser-Ney model of order ``n <= self.n`` from the same counts (its top level uses
        the real counts, so its levels differ from this model's lower levels)."""
        _check_order(n, self.n)
        if n == self.n:
            return self
        return _kn_model(self.vocab_size, self.alphabet, self.grams[:n], self.continuation[:n - 1])


Model = NGram | KneserNey


def _check_order(n: int, top: int) -> None:
    if not 1 <= n <= top:
        raise ValueError(f"need 1 <= n <= {top} (the order this model was counted to); got n={n}")


def _per_level(k: float | Sequence[float], n: int) -> tuple[float, ...]:
    """One add-k weight per level: a number for all n levels, or a sequence of n numbers."""
    ks = (k,) * n if isinstance(k, numbers.Real) else tuple(k)
    if len(ks) != n or not all(isinstance(x, numbers.Real) and x >= 0 for x in ks):  # also refuses NaN
        raise ValueError(f"k must be a number k >= 0 or a sequence of n={n} numbers k >= 0; got {k!r}")
    return tuple(float(x) for x in ks)


def _check_ids(ids, vocab_size: int, at_least: int) -> torch.Tensor:
    ids = torch.as_tensor(ids)
    if (ids.dim() != 1 or len(ids) < at_least or ids.is_floating_point() or ids.is_complex()
            or (len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size))):
        raise ValueError(f"ids must be a 1-D integer tensor of at least {at_least} ids in [0, {vocab_size}), "
                         f"got {ids.dtype} of shape {tuple(ids.shape)}")
    return ids.to(torch.int64)


def _codes(alphabet: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Each id's code: 1 + its place in ``alphabet``, or 0 if it is not there: (N,) -> (N,).

    >>> _codes(torch.tensor([3, 7]), torch.tensor([7, 3, 5])).tolist()
    [2, 1, 0]
    """
    i = torch.searchsorted(alphabet, ids).clamp(max=len(alphabet) - 1)
    return torch.where(alphabet[i] == ids, i + 1, 0)


def _keys(codes: torch.Tensor, m: int, B: int) -> torch.Tensor:
    """The key of the m-gram ending at each position t >= m - 1, digits in base B: (N,) -> (N - m + 1,).

    >>> _keys(torch.tensor([1, 2, 3]), 2, 10).tolist()    # "12", "23" in base 10
    [12, 23]
    """
    key = torch.zeros(len(codes) - m + 1, dtype=torch.int64)
    for j in range(m):  # oldest token first: the most significant digit
        key = key * B + codes[j:len(codes) - m + 1 + j]
    return key


def _find(seen: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each key sits in the sorted ``seen`` (a valid index) and whether it is there."""
    if len(seen) == 0:
        return torch.zeros_like(keys), torch.zeros_like(keys, dtype=torch.bool)
    i = torch.searchsorted(seen, keys).clamp(max=len(seen) - 1)
    return i, seen[i] == keys


def _lookup(seen: torch.Tensor, values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The value of each key in a (sorted keys, values) table, 0 for keys it lacks."""
    if len(seen) == 0:
        return torch.zeros(keys.shape, dtype=values.dtype)
    i, hit = _find(seen, keys)
    return torch.where(hit, values[i], 0)


def _count(ids, n: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """The alphabet, the codes of ``ids`` and the sorted (keys, counts) of its 1- to n-grams."""
    if n < 1 or vocab_size < 1:
        raise ValueError(f"need n >= 1 and vocab_size >= 1; got n={n}, vocab_size={vocab_size}")
    ids = _check_ids(ids, vocab_size, at_least=n)
    alphabet = torch.unique(ids)  # (A,) sorted
    B = len(alphabet) + 1
    if B ** n >= 2**63:
        raise ValueError(f"the keys of {n}-grams over the {B - 1} distinct tokens of ids (plus one code for "
                         f"any other) need {B}**{n} >= 2**63 values: more than int64 keys hold; lower n")
    codes = _codes(alphabet, ids)
    grams = [torch.unique(_keys(codes, m, B), sorted=True, return_counts=True) for m in range(1, n + 1)]
    return alphabet, codes, grams


def fit(ids: torch.Tensor, n: int, vocab_size: int, k: float | Sequence[float]) -> NGram:
    """The add-k model of order ``n`` of ``ids`` (a (N,) tensor of token ids below ``vocab_size``),
    with ``k`` one weight for every level or the sequence ``k_1..k_n``."""
    alphabet, _, grams = _count(ids, n, vocab_size)
    ks = _per_level(k, n)
    contexts = []
    for keys, counts in grams:
        # the context, the first m - 1 tokens, is key // B; sorted keys keep equal contexts together
        ctx, which = torch.unique_consecutive(keys // (len(alphabet) + 1), return_inverse=True)
        n_h = torch.zeros_like(ctx).index_add_(0, which, counts)  # count(h) = sum_c count(h c)
        contexts.append((ctx, n_h))
    return NGram(n, vocab_size, alphabet, grams, ks, contexts)


def _discounts(a: torch.Tensor, m: int) -> tuple[float, float, float]:
    """(D1, D2, D3+) of one order from its counts ``a`` (K,), as Chen and Goodman (1998) estimate
    them; the fallback where the count-of-counts cannot give them (KenLM rejects a D outside [0, i]
    too: below 0 gamma turns negative; above i a level would hand down more than it takes)."""
    t1, t2, t3, t4 = torch.bincount(a.clamp(max=5), minlength=6)[1:5].tolist()
    if min(t1, t2, t3) > 0:
        Y = t1 / (t1 + 2 * t2)
        D = (1 - 2 * Y * t2 / t1, 2 - 3 * Y * t3 / t2, 3 - 4 * Y * t4 / t3)
        if all(0 <= d <= i for i, d in enumerate(D, 1)):
            return D
    return FALLBACK


def _kn_level(keys: torch.Tensor, a: torch.Tensor, B: int, m: int) -> tuple:
    """One level's discounts and its lookup tables from its sorted keys (K,) and counts ``a`` (K,)."""
    D = _discounts(a, m)
    d = torch.tensor((0.0, *D), dtype=torch.float64)[a.clamp(max=3)]  # (K,) the discount of each m-gram
    ctx, which = torch.unique_consecutive(keys // B, return_inverse=True)  # (H,) contexts, (K,) each one's
    a_h = torch.zeros(len(ctx), dtype=torch.float64).index_add_(0, which, a.double())  # (H,) a(h)
    gamma = torch.zeros_like(a_h).index_add_(0, which, d) / a_h  # the mass the discounts free, per context
    share = (a.double() - d).clamp(min=0) / a_h[which]  # (K,) max(a(h c) - D, 0) / a(h)
    return D, ((keys, share), (ctx, gamma))


def _kn_model(V: int, alphabet: torch.Tensor, grams: list, continuation: list) -> KneserNey:
    """Levels 1..n-1 on continuation counts, level n on real counts."""
    B, top, discounts, levels = len(alphabet) + 1, len(grams), [], []
    for m in range(1, top + 1):
        D, tables = _kn_level(grams[m - 1][0], continuation[m - 1] if m < top else grams[m - 1][1], B, m)
        discounts.append(D)
        levels.append(tables)
    return KneserNey(top, V, alphabet, grams, continuation, discounts, levels)


def kneser_ney(ids: torch.Tensor, n: int, vocab_size: int) -> KneserNey:
    """The interpolated modified Kneser-Ney model of order ``n`` of ``ids`` (a (N,) tensor of token
    ids below ``vocab_size``), as the module docstring defines it."""
    alphabet, codes, grams = _count(ids, n, vocab_size)
    B, continuation = len(alphabet) + 1, []
    for m in range(1, n):
        # each distinct (m+1)-gram is one distinct token before the m-gram it ends with
        after_first, n_before = torch.unique(grams[m][0] % B ** m, return_counts=True)
        a = _lookup(after_first, n_before, grams[m - 1][0])
        start = _keys(codes[:m], m, B)  # (1,) the text's first m tokens: the start of text precedes them
        continuation.append(a + (grams[m - 1][0] == start))  # every m-gram seen gets a >= 1
    return _kn_model(vocab_size, alphabet, grams, continuation)


def _walk(model: Model, history: torch.Tensor, targets: torch.Tensor):
    """For each level m = 1..n: (context keys, m-gram keys), each (R,), with ``history`` (R, n - 1)
    the codes before each target, oldest first, and ``targets`` (R,) codes."""
    B = len(model.alphabet) + 1
    ctx = torch.zeros_like(targets)  # the key of the last m - 1 tokens of the history
    for m in range(1, model.n + 1):
        if m > 1:
            ctx = ctx + history[:, -(m - 1)] * B ** (m - 2)  # m - 1 places back: the most significant digit
        yield ctx, ctx * B + targets


def _add_k(p: torch.Tensor, n_hc: torch.Tensor, n_h: torch.Tensor, k: float) -> torch.Tensor:
    """One add-k level on top of the level below, ``p`` (R,)."""
    denom = n_h + k
    p_m = (n_hc + k * p) / denom.clamp(min=1e-300)
    return torch.where(denom > 0, p_m, p)  # a context never seen with k = 0: the level below


def _addk_counts(model: NGram, history: torch.Tensor, targets: torch.Tensor) -> list[tuple]:
    """For each level: (count(h c), count(h)), each (R,)."""
    return [(_lookup(*model.grams[m], gk).double(), _lookup(*model.contexts[m], ck).double())
            for m, (ck, gk) in enumerate(_walk(model, history, targets))]


def _prob(model: Model, history: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """p_n(target | history) for each row: (R, n - 1) codes, (R,) codes -> (R,) float64."""
    p = torch.full(targets.shape, 1.0 / model.vocab_size, dtype=torch.float64)  # p_0
    if isinstance(model, NGram):
        for (n_hc, n_h), k in zip(_addk_counts(model, history, targets), model.ks, strict=True):
            p = _add_k(p, n_hc, n_h, k)
        return p
    for (ck, gk), ((g_keys, share), (h_keys, gamma)) in zip(_walk(model, history, targets), model.levels,
                                                            strict=True):
        i, seen_hc = _find(g_keys, gk)
        j, seen_h = _find(h_keys, ck)  # a(h) > 0 exactly for the contexts in the table
        p_m = torch.where(seen_hc, share[i], 0.0) + gamma[j] * p
        p = torch.where(seen_h, p_m, p)  # a(h) = 0: the level below
    return p


def _history(model: Model, codes: torch.Tensor) -> torch.Tensor:
    """The n - 1 codes before each of codes[1:], oldest first, 0 before the start: (N,) -> (N - 1, n - 1).

    Code 0, "any other token", never occurs in a counted gram, so no context holding it was seen and
    each level that reaches back before the start of the text is the level below: a shorter history.
    """
    padded = torch.cat([torch.zeros(model.n - 1, dtype=torch.int64), codes])
    return padded.unfold(0, model.n - 1, 1)[1:len(codes)]  # row t - 1 holds codes[t - n + 1 : t]


def probs(model: Model, context: Sequence[int]) -> torch.Tensor:
    """The (V,) distribution of the next token after ``context`` (only its last n - 1 tokens count)."""
    V = model.vocab_size
    ctx = _codes(model.alphabet, _check_ids(torch.as_tensor(list(context), dtype=torch.int64), V, 0))
    h = ([0] * (model.n - 1) + ctx.tolist())[len(ctx):]  # the last n - 1, 0 where the context is shorter
    history = torch.tensor(h, dtype=torch.int64).reshape(1, model.n - 1).expand(V, model.n - 1)
    return _prob(model, history, _codes(model.alphabet, torch.arange(V)))


def log_probs(model: Model, ids: torch.Tensor) -> torch.Tensor:
    """ln p(ids[t] | the n - 1 tokens before it) for t = 1, ..., N - 1 (the first tokens of ``ids``
    use the shorter history they have): (N,) -> (N - 1,), float64."""
    codes = _codes(model.alphabet, _check_ids(ids, model.vocab_size, 0))
    return _prob(model, _history(model, codes), codes[1:]).log()


def cross_entropy(model: Model, ids: torch.Tensor) -> float:
    """Mean negative log-likelihood of ids[1:], in nats per token: comparable with the loss of a
    language model that predicts the same targets ``ids[1:]``."""
    return -log_probs(model, _check_ids(ids, model.vocab_size, 2)).mean().item()


GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # the values of k that tune_k tries


def tune_k(train_ids: torch.Tensor, n: int, vocab_size: int, grid: Sequence[float] = GRID,
           held_out: float = 0.1) -> list[float]:
    """``[k_1, ..., k_n]``: for each level in turn (unigram first), the ``k`` of ``grid`` with which
    the model of that order, its lower levels' ``k`` already chosen, predicts the last ``held_out``
    of ``train_ids`` best when the counts come from the rest: a choice made on training tokens only
    (ties go to the earlier k of ``grid``). ``fit(ids, m, V, ks[:m])`` is then the tuned m-gram."""
    if not grid or not 0 < held_out < 1:
        raise ValueError(f"need a non-empty grid and 0 < held_out < 1; got {grid!r}, {held_out}")
    _per_level(tuple(grid), len(grid))  # every k >= 0
    train_ids = _check_ids(train_ids, vocab_size, n + 2)
    cut = len(train_ids) - max(2, int(len(train_ids) * held_out))
    fitted = fit(train_ids[:cut], n, vocab_size, 0.0)
    tail = _codes(fitted.alphabet, train_ids[cut:])
    counts = _addk_counts(fitted, _history(fitted, tail), tail[1:])  # the same for every k
    p, best = torch.full((len(tail) - 1,), 1.0 / vocab_size, dtype=torch.float64), []
    for level in counts:
        losses = [-_add_k(p, *level, float(k)).log().mean().item() for k in grid]
        best.append(float(grid[losses.index(min(losses))]))
        p = _add_k(p, *level, best[-1])  # fixed from now on
    return best
