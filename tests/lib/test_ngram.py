"""Tests for course_lib.ngram.

Add-k: a hand-worked bigram with a different k per level (the module docstring's, arithmetic
written out); an oracle, the same formula written with Python dicts over every context, on random
text with tokens never seen; properties (every distribution sums to 1, the add-0 unigram is
counts / total, a context never seen falls back to the order below, lower orders of a fitted model
equal models fitted at those orders); tune_k chooses level by level on the training tokens alone,
checked against a brute-force search through the public functions.

Kneser-Ney: a hand-worked bigram (counts, continuation counts, discounts, gammas, probabilities);
an independent reference written from the definitions with dicts, sets and exact fractions,
compared on random small texts at orders 1-5 with unseen histories and unseen tokens; sums to 1;
edge cases (n = 1, count-of-counts with zeros, short texts) and bad input; and the numbers an
outside implementation measured on chapter 03's split.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import pytest
import torch

from course_lib import ngram

# --- add-k --------------------------------------------------------------------------------------


def test_hand_worked_bigram_with_a_k_per_level():
    """V = 3, text 0 1 0 1 2, k_1 = 3, k_2 = 1. Unigram counts (2, 2, 1) of 5:
    p1 = ((2 + 3/3) / 8, (2 + 3/3) / 8, (1 + 3/3) / 8) = (3/8, 3/8, 1/4).
    After 0 the text has 0 -> 1 twice (count(0) = 2 as a context, count(0 1) = 2):
    p2(c | 0) = (count(0 c) + 1 * p1(c)) / (2 + 1) = (1/8, (2 + 3/8) / 3, 1/12) = (1/8, 19/24, 1/12).
    After 1: 1 -> 0 once and 1 -> 2 once, so p2(c | 1) = ((1, 0, 1) + p1) / 3 = (11/24, 1/8, 5/12).
    After 2 (never a context: it ends the text) p2(. | 2) = p1."""
    f = torch.float64
    m = ngram.fit(torch.tensor([0, 1, 0, 1, 2]), n=2, vocab_size=3, k=(3.0, 1.0))
    assert m.ks == (3.0, 1.0)
    p1 = torch.tensor([3 / 8, 3 / 8, 1 / 4], dtype=f)
    torch.testing.assert_close(ngram.probs(m.order(1, 3.0), []), p1)
    torch.testing.assert_close(ngram.probs(m, [0]), torch.tensor([1 / 8, 19 / 24, 1 / 12], dtype=f))
    torch.testing.assert_close(ngram.probs(m, [1]), torch.tensor([11 / 24, 1 / 8, 5 / 12], dtype=f))
    torch.testing.assert_close(ngram.probs(m, [2]), p1)
    # log_probs scores ids[1:]: 1 after 0, 0 after 1, 1 after 0, 2 after 1
    want = torch.tensor([19 / 24, 11 / 24, 19 / 24, 5 / 12], dtype=f).log()
    torch.testing.assert_close(ngram.log_probs(m, torch.tensor([0, 1, 0, 1, 2])), want)
    # one k for all levels is the same as that k repeated
    torch.testing.assert_close(ngram.probs(m.order(2, 1.0), [0]), ngram.probs(m.order(2, (1.0, 1.0)), [0]))


def _oracle(ids: list[int], n: int, V: int, ks: list[float], history: list[int], c: int) -> float:
    """The module docstring's recursion with dicts, every count recomputed from the text."""
    p = 1.0 / V
    for m in range(1, n + 1):
        if len(history) < m - 1:
            break
        h = tuple(history[len(history) - (m - 1):]) if m > 1 else ()
        grams = Counter(tuple(ids[i:i + m]) for i in range(len(ids) - m + 1))
        n_h = sum(v for g, v in grams.items() if g[:-1] == h)
        if n_h + ks[m - 1] > 0:
            p = (grams[h + (c,)] + ks[m - 1] * p) / (n_h + ks[m - 1])
    return p


@pytest.mark.parametrize("n,ks", [(1, [0.0]), (2, [0.5, 3.0]), (3, [2.0, 0.1, 7.0]),
                                  (4, [0.1, 1.0, 0.0, 4.0])])
def test_matches_an_independent_dict_implementation(n, ks):
    g = torch.Generator().manual_seed(n)
    V = 7  # tokens 5 and 6 never occur in the text
    ids = torch.randint(0, 5, (60,), generator=g)
    ids[20:30] = ids[:10]  # some repeated contexts
    m = ngram.fit(ids, n, V, ks)
    text = ids.tolist()
    for history in ([], text[:1], text[3:6], [4, 4, 4], [6, 1, 2], [1, 2, 6]):
        got = ngram.probs(m, history)
        want = torch.tensor([_oracle(text, n, V, ks, history, c) for c in range(V)], dtype=torch.float64)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [0.0, 0.01, 1.0, 50.0, (0.01, 50.0, 1.0, 0.0)])
def test_every_distribution_sums_to_one(n, k):
    ids = torch.randint(0, 7, (200,), generator=torch.Generator().manual_seed(1))
    m = ngram.fit(ids, n, 9, k if isinstance(k, float) else k[:n])
    for history in ([], [3], [1, 2], [0, 5, 6], [6, 6, 6], [8, 8, 8], ids[:9].tolist()):
        p = ngram.probs(m, history)
        assert p.shape == (9,) and (p >= 0).all()
        assert p.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_add_zero_unigram_is_counts_over_total():
    ids = torch.tensor([3, 1, 3, 3, 0, 1, 3])
    p = ngram.probs(ngram.fit(ids, 1, 5, 0.0), [])
    torch.testing.assert_close(p, torch.bincount(ids, minlength=5).double() / len(ids))


def test_unseen_context_is_the_order_below_and_a_huge_k_is_the_order_below_too():
    ids = torch.randint(0, 6, (300,), generator=torch.Generator().manual_seed(2))
    ids[ids == 5] = 4  # token 5 never occurs, so no context contains it
    tri = ngram.fit(ids, 3, 6, 0.7)
    torch.testing.assert_close(ngram.probs(tri, [5, 5]), ngram.probs(tri.order(1, 0.7), []))
    torch.testing.assert_close(ngram.probs(tri, [2, 5]), ngram.probs(tri.order(1, 0.7), []))
    near_bigram = tri.order(3, (0.7, 0.7, 1e12))
    torch.testing.assert_close(ngram.probs(near_bigram, [1, 2]), ngram.probs(ngram.fit(ids, 2, 6, 0.7), [2]))


def test_lower_orders_equal_models_fitted_at_that_order():
    ids = torch.randint(0, 9, (500,), generator=torch.Generator().manual_seed(3))
    four = ngram.fit(ids, 4, 9, 1.0)
    for n in (1, 2, 3):
        ks = [0.3, 2.0, 5.0][:n]
        torch.testing.assert_close(ngram.log_probs(four.order(n, ks), ids[:50]),
                                   ngram.log_probs(ngram.fit(ids, n, 9, ks), ids[:50]))


def test_cross_entropy_of_a_uniform_model_is_ln_v():
    ids = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(4))
    uniform = ngram.fit(ids, 1, 4, 1e15)  # the prior swamps the counts
    assert ngram.cross_entropy(uniform, ids) == pytest.approx(math.log(4), rel=1e-6)


def test_more_context_helps_on_a_patterned_text_and_tune_k_uses_training_tokens_only():
    text = torch.tensor([0, 1, 2, 3] * 200)
    train, val = text[:700], text[700:]
    ks = ngram.tune_k(train, 3, 4)
    assert len(ks) == 3 and all(k in ngram.GRID for k in ks)
    losses = [ngram.cross_entropy(ngram.fit(train, n, 4, ks[:n]), val) for n in (1, 2, 3)]
    assert losses[0] == pytest.approx(math.log(4), abs=0.01) and losses[1] < 0.05 and losses[2] < 0.05


def test_tune_k_picks_each_level_in_turn_on_the_training_tail():
    """Tokens drawn independently with skewed frequencies: the unigram's counts are worth trusting
    (small k_1) while the bigram's are noise around it (large k_2). A brute-force search with the
    public functions, level by level on the same split of the training tokens, agrees."""
    g = torch.Generator().manual_seed(5)
    freq = torch.tensor([0.5, 0.25, 0.12, 0.08, 0.05])
    train = torch.multinomial(freq, 3000, replacement=True, generator=g)
    ks = ngram.tune_k(train, 3, 6)
    cut = len(train) - int(len(train) * 0.1)
    chosen: list[float] = []
    for m in (1, 2, 3):
        losses = [ngram.cross_entropy(ngram.fit(train[:cut], m, 6, [*chosen, k]), train[cut:])
                  for k in ngram.GRID]
        chosen.append(ngram.GRID[losses.index(min(losses))])
    assert ks == chosen
    assert ks[0] < ks[1]  # the best k differs by level


def test_order_eight_over_bytes_fits_the_keys_and_bad_input_is_named():
    text = torch.tensor(list(b"to be or not to be, that is the question" * 3))
    eight = ngram.fit(text, 8, 256, 1.0)  # 256**8 keys would overflow; the 16 bytes seen need 17**8
    assert eight.distinct(8) == len({tuple(text[i:i + 8].tolist()) for i in range(len(text) - 7)})
    assert ngram.probs(eight, list(b"xyz")).sum().item() == pytest.approx(1.0, abs=1e-12)
    wide = torch.arange(200).repeat(2)
    with pytest.raises(ValueError, match="int64"):
        ngram.fit(wide, 9, 256, 1.0)  # 201**9 >= 2**63
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.fit(torch.tensor([0, 9]), 1, 5, 1.0)
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.fit(torch.tensor([0.0, 1.0]), 1, 5, 1.0)
    with pytest.raises(ValueError, match="at least 3 ids"):
        ngram.fit(torch.tensor([0, 1]), 3, 5, 1.0)
    with pytest.raises(ValueError, match="k >= 0"):
        ngram.fit(torch.tensor([0, 1]), 1, 5, -1.0)
    with pytest.raises(ValueError, match="sequence of n=2"):
        ngram.fit(torch.tensor([0, 1]), 2, 5, (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="n <= 2"):
        ngram.fit(torch.tensor([0, 1, 1]), 2, 5, 1.0).order(3, 1.0)
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.log_probs(eight, torch.tensor([0, 300]))
    with pytest.raises(ValueError, match="at least 2 ids"):
        ngram.cross_entropy(eight, torch.tensor([5]))


def test_distinct_counts_the_rows_of_each_table():
    m = ngram.fit(torch.tensor([0, 1, 0, 1, 2]), 3, 3, 1.0)
    assert [m.distinct(n) for n in (1, 2, 3)] == [3, 3, 3]  # {0, 1, 2}; {01, 10, 12}; {010, 101, 012}


# --- Kneser-Ney ---------------------------------------------------------------------------------

HAND = [0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 2]


def test_hand_worked_kneser_ney_bigram():
    """V = 4 (token 3 never occurs), text 0 0 0 0 0 1 0 1 0 1 1 2, n = 2.

    Bigram level, real counts: 00 x4, 01 x3, 10 x2, 11 x1, 12 x1. Count-of-counts t1..t4 =
    (2, 1, 1, 1): Y = 2 / (2 + 2) = 1/2, D1 = 1 - 2 Y 1/2 = 1/2, D2 = 2 - 3 Y 1/1 = 1/2,
    D3+ = 3 - 4 Y 1/1 = 1.
    Unigram level, continuation counts (distinct tokens just before; the start of the text is one):
    0 after {start, 0, 1} -> 3, 1 after {0, 1} -> 2, 2 after {1} -> 1, 3 -> 0. t1..t4 = (1, 1, 1, 0):
    Y = 1/3, D1 = 1 - 2/3 = 1/3, D2 = 2 - 3 Y = 1, D3+ = 3 - 0 = 3.
    Unigram: a(.) = 6, gamma = (D1 N1 + D2 N2 + D3+ N3+) / 6 = (1/3 + 1 + 3) / 6 = 13/18, so
    p1 = ((3 - 3) / 6, (2 - 1) / 6, (1 - 1/3) / 6, 0) + 13/18 / 4 = (13, 25, 21, 13) / 72.
    After 0: a(0) = 4 + 3 = 7, both counts >= 3 lose D3+ = 1, gamma(0) = 2/7:
    p2(. | 0) = ((3, 2, 0, 0) / 7) + 2/7 p1 = (3/7 + 13/252, 2/7 + 25/252, 21/252, 13/252).
    After 1: a(1) = 2 + 1 + 1 = 4, 10 loses D2 = 1/2, 11 and 12 lose D1 = 1/2, gamma(1) = (3/2) / 4 = 3/8:
    p2(. | 1) = ((3/2, 1/2, 1/2, 0) / 4) + 3/8 p1 = (255, 147, 135, 39) / 576.
    After 2 (ends the text, never a context) and after 3 (never seen): p1."""
    kn = ngram.kneser_ney(torch.tensor(HAND), 2, 4)
    F = torch.float64
    assert kn.discounts == [pytest.approx((1 / 3, 1.0, 3.0)), pytest.approx((0.5, 0.5, 1.0))]
    assert kn.continuation[0].tolist() == [3, 2, 1]
    p1 = torch.tensor([13, 25, 21, 13], dtype=F) / 72
    torch.testing.assert_close(ngram.probs(kn, [2]), p1)
    torch.testing.assert_close(ngram.probs(kn, [3]), p1)
    torch.testing.assert_close(ngram.probs(kn, []), p1)  # no history: the unigram level
    torch.testing.assert_close(ngram.probs(kn, [0]), torch.tensor([3 / 7 + 13 / 252, 2 / 7 + 25 / 252,
                                                                   21 / 252, 13 / 252], dtype=F))
    torch.testing.assert_close(ngram.probs(kn, [1]), torch.tensor([255, 147, 135, 39], dtype=F) / 576)
    # log_probs scores ids[1:]: 1 after 0, 2 after 1, 3 after 2
    torch.testing.assert_close(ngram.log_probs(kn, torch.tensor([0, 1, 2, 3])),
                               torch.tensor([2 / 7 + 25 / 252, 135 / 576, 13 / 72], dtype=F).log())


def _kn_reference(text: list[int], n: int, V: int, history: list[int], c: int) -> Fraction:
    """Interpolated modified Kneser-Ney from the definitions, with dicts, sets and exact fractions."""

    def counts(m: int) -> dict[tuple, int]:
        grams = [tuple(text[i:i + m]) for i in range(len(text) - m + 1)]
        if m == n:
            return Counter(grams)
        before: dict[tuple, set] = {}
        for i, gram in enumerate(grams):
            before.setdefault(gram, set()).add(text[i - 1] if i > 0 else "start of text")
        return {gram: len(s) for gram, s in before.items()}

    def discounts(a: dict[tuple, int]) -> tuple:
        t1, t2, t3, t4 = (sum(1 for v in a.values() if v == i) for i in (1, 2, 3, 4))
        if t1 and t2 and t3:
            Y = Fraction(t1, t1 + 2 * t2)
            D = (1 - 2 * Y * t2 / t1, 2 - 3 * Y * t3 / t2, 3 - 4 * Y * t4 / t3)
            if 0 <= D[0] <= 1 and 0 <= D[1] <= 2 and 0 <= D[2] <= 3:
                return D
        return (Fraction(1, 2), Fraction(1), Fraction(3, 2))

    p = Fraction(1, V)
    for m in range(1, n + 1):
        if len(history) < m - 1:
            break
        h = tuple(history[len(history) - (m - 1):]) if m > 1 else ()
        a = counts(m)
        D1, D2, D3 = discounts(a)
        after_h = {g[-1]: v for g, v in a.items() if g[:-1] == h}
        a_h = sum(after_h.values())
        if a_h == 0:
            continue  # a history never seen: the level below
        N1, N2, N3 = (sum(1 for v in after_h.values() if v == 1), sum(1 for v in after_h.values() if v == 2),
                      sum(1 for v in after_h.values() if v >= 3))
        gamma = (D1 * N1 + D2 * N2 + D3 * N3) / a_h
        a_hc = after_h.get(c, 0)
        D = 0 if a_hc == 0 else D1 if a_hc == 1 else D2 if a_hc == 2 else D3
        p = max(a_hc - D, 0) / a_h + gamma * p
    return p


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_kneser_ney_matches_an_independent_reference(seed, n):
    g = torch.Generator().manual_seed(seed)
    V, N = 7, [150, 400, 60][seed]  # tokens 5 and 6 never occur; the short text makes discounts fall back
    ids = torch.multinomial(torch.tensor([0.4, 0.25, 0.15, 0.12, 0.08]), N, replacement=True, generator=g)
    ids[N // 2:N // 2 + 20] = ids[:20]  # some repeated contexts
    text = ids.tolist()
    kn = ngram.kneser_ney(ids, n, V)
    for history in ([], text[:1], text[-3:], text[7:11], [6], [6, 1, 2], [1, 6, 2], [0, 0, 0, 0]):
        want = torch.tensor([float(_kn_reference(text, n, V, history, c)) for c in range(V)],
                            dtype=torch.float64)
        torch.testing.assert_close(ngram.probs(kn, history), want, rtol=1e-12, atol=1e-15)
    other = [3, 5, 0, 1, 1, 2, 6, 0]  # scored with the shorter history at its start, unseen tokens
    want = [math.log(_kn_reference(text, n, V, other[max(0, t - n + 1):t], other[t])) for t in range(1, 8)]
    torch.testing.assert_close(ngram.log_probs(kn, torch.tensor(other)),
                               torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_kneser_ney_distributions_sum_to_one_and_lower_orders_match(n):
    ids = torch.randint(0, 7, (300,), generator=torch.Generator().manual_seed(6))
    kn = ngram.kneser_ney(ids, n, 9)
    for history in ([], [3], [1, 2], [0, 5, 6], [8, 8, 8], ids[:9].tolist(), [2, 8, 1, 1]):
        p = ngram.probs(kn, history)
        assert p.shape == (9,) and (p > 0).all()  # tokens 7 and 8 never occur, yet keep some probability
        assert p.sum().item() == pytest.approx(1.0, abs=1e-12)
    for m in range(1, n + 1):  # .order(m) uses real counts at its top level, as a model fitted at order m
        torch.testing.assert_close(ngram.log_probs(kn.order(m), ids[:60]),
                                   ngram.log_probs(ngram.kneser_ney(ids, m, 9), ids[:60]))


def test_kneser_ney_edge_cases_and_bad_input():
    tiny = ngram.kneser_ney(torch.tensor([0, 1, 2]), 1, 4)  # n = 1: real counts, every one 1: t2 = t3 = 0
    assert tiny.discounts == [ngram.FALLBACK]
    # p(c) = max(1 - 1/2, 0) / 3 + gamma / 4, gamma = 3 * 1/2 / 3 = 1/2
    torch.testing.assert_close(ngram.probs(tiny, [2, 1]), torch.tensor([1 / 6 + 1 / 8] * 3 + [1 / 8],
                                                                       dtype=torch.float64))
    assert ngram.cross_entropy(tiny, torch.tensor([3, 3])) == pytest.approx(math.log(8))
    short = ngram.kneser_ney(torch.tensor([0, 1, 2, 0]), 4, 3)  # ids just as long as n
    assert ngram.FALLBACK in short.discounts
    assert ngram.log_probs(short, torch.tensor([1, 2])).shape == (1,)  # shorter than n: a shorter history
    assert ngram.log_probs(short, torch.tensor([1])).shape == (0,)
    with pytest.raises(ValueError, match="at least 5 ids"):
        ngram.kneser_ney(torch.tensor([0, 1, 2, 0]), 5, 3)
    with pytest.raises(ValueError, match="n >= 1"):
        ngram.kneser_ney(torch.tensor([0, 1, 2, 0]), 0, 3)
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.kneser_ney(torch.tensor([[0, 1], [2, 0]]), 1, 3)
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.kneser_ney(torch.tensor([0, -1, 2]), 1, 3)
    with pytest.raises(ValueError, match="int64"):
        ngram.kneser_ney(torch.arange(200).repeat(2), 9, 256)
    with pytest.raises(ValueError, match="n <= 4"):
        short.order(5)


# --- the outside numbers ------------------------------------------------------------------------

# validation nats per byte of an outside implementation of interpolated modified Kneser-Ney
OUTSIDE = {2: 2.503, 3: 1.932, 4: 1.617, 5: 1.485, 6: 1.452, 7: 1.450, 8: 1.454}


def test_chapter_03_split_reproduces_an_outside_kneser_ney_and_beats_add_k():
    """Chapter 03's split (about 4 s on one core). The four bytes of the validation text that the
    training text lacks get their share of the uniform 1 / 256."""
    from course_lib import data

    ids = data.encode_corpus(data.shakespeare(max_chars=1_000_000))
    train_ids, val_ids = data.train_val_split(ids, val_fraction=0.1)
    kn = ngram.kneser_ney(train_ids, 8, 256)
    got = {n: ngram.cross_entropy(kn.order(n), val_ids) for n in OUTSIDE}
    assert got == pytest.approx(OUTSIDE, abs=0.005)
    ks = ngram.tune_k(train_ids, 8, 256)
    counts = ngram.fit(train_ids, 8, 256, 0.0)
    add_k = {n: ngram.cross_entropy(counts.order(n, ks[:n]), val_ids) for n in OUTSIDE}
    assert all(got[n] < add_k[n] for n in OUTSIDE), (got, add_k)
