"""Tests for course_lib.ngram.

A hand-worked bigram (the module docstring's, with the arithmetic written out); an oracle, the
same formula written with Python dicts over every context, on random text; properties: every
distribution sums to 1 over the vocabulary, the add-0 unigram is counts / total, a context never
seen falls back to the order below exactly, the lower orders of a fitted model equal models fitted
at those orders, and tune_k never looks past the training tokens it is given.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from course_lib import ngram


def test_hand_worked_bigram():
    """V = 3, text 0 1 0 1 2, k = 1. Unigram counts (2, 2, 1) of 5:
    p1 = ((2 + 1/3) / 6, (2 + 1/3) / 6, (1 + 1/3) / 6) = (7/18, 7/18, 4/18).
    After 0 the text has 0 -> 1 twice (count(0) = 2 as a context, count(0 1) = 2):
    p2(c | 0) = (count(0 c) + p1(c)) / 3 = (7/54, (2 + 7/18) / 3, 4/54).
    After 1: 1 -> 0 once and 1 -> 2 once, so p2(c | 1) = ((1, 0, 1) + p1) / 3. After 2 (never a
    context: it ends the text) p2(. | 2) = p1."""
    m = ngram.fit(torch.tensor([0, 1, 0, 1, 2]), n=2, vocab_size=3, k=1.0)
    p1 = torch.tensor([7 / 18, 7 / 18, 4 / 18], dtype=torch.float64)
    torch.testing.assert_close(ngram.probs(m.order(1, 1.0), []), p1)
    torch.testing.assert_close(ngram.probs(m, [0]), torch.tensor([7 / 54, (2 + 7 / 18) / 3, 4 / 54],
                                                                 dtype=torch.float64))
    torch.testing.assert_close(ngram.probs(m, [2]), p1)
    # log_probs scores ids[1:]: 1 after 0, 0 after 1, 1 after 0, 2 after 1
    p2_after_1 = (torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64) + p1) / 3
    want = torch.stack([ngram.probs(m, [0])[1], p2_after_1[0], ngram.probs(m, [0])[1], p2_after_1[2]]).log()
    torch.testing.assert_close(ngram.log_probs(m, torch.tensor([0, 1, 0, 1, 2])), want)


def _oracle(ids: list[int], n: int, V: int, k: float, history: list[int], c: int) -> float:
    """The module docstring's recursion with dicts, every count recomputed from the text."""
    p = 1.0 / V
    for m in range(1, n + 1):
        if len(history) < m - 1:
            break
        h = tuple(history[len(history) - (m - 1):]) if m > 1 else ()
        grams = Counter(tuple(ids[i:i + m]) for i in range(len(ids) - m + 1))
        n_h = sum(v for g, v in grams.items() if g[:-1] == h)
        if n_h + k > 0:
            p = (grams[h + (c,)] + k * p) / (n_h + k)
    return p


@pytest.mark.parametrize("n,k", [(1, 0.0), (2, 0.5), (3, 2.0), (4, 0.1)])
def test_matches_an_independent_dict_implementation(n, k):
    g = torch.Generator().manual_seed(n)
    V = 5
    ids = torch.randint(0, V, (60,), generator=g)
    ids[20:30] = ids[:10]  # some repeated contexts
    m = ngram.fit(ids, n, V, k)
    text = ids.tolist()
    for history in ([], text[:1], text[3:6], [4, 4, 4]):
        got = ngram.probs(m, history)
        want = torch.tensor([_oracle(text, n, V, k, history, c) for c in range(V)], dtype=torch.float64)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [0.0, 0.01, 1.0, 50.0])
def test_every_distribution_sums_to_one(n, k):
    ids = torch.randint(0, 7, (200,), generator=torch.Generator().manual_seed(1))
    m = ngram.fit(ids, n, 7, k)
    for history in ([], [3], [1, 2], [0, 5, 6], [6, 6, 6], ids[:9].tolist()):
        p = ngram.probs(m, history)
        assert p.shape == (7,) and (p >= 0).all()
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
    near_bigram = tri.order(3, 1e12)
    torch.testing.assert_close(ngram.probs(near_bigram, [1, 2]), ngram.probs(ngram.fit(ids, 2, 6, 1e12), [2]))


def test_lower_orders_equal_models_fitted_at_that_order():
    ids = torch.randint(0, 9, (500,), generator=torch.Generator().manual_seed(3))
    four = ngram.fit(ids, 4, 9, 1.0)
    for n in (1, 2, 3):
        torch.testing.assert_close(ngram.log_probs(four.order(n, 0.3), ids[:50]),
                                   ngram.log_probs(ngram.fit(ids, n, 9, 0.3), ids[:50]))


def test_cross_entropy_of_a_uniform_model_is_ln_v():
    ids = torch.randint(0, 4, (40,), generator=torch.Generator().manual_seed(4))
    uniform = ngram.fit(ids, 1, 4, 1e15)  # the prior swamps the counts
    assert ngram.cross_entropy(uniform, ids) == pytest.approx(math.log(4), rel=1e-6)


def test_more_context_helps_on_a_patterned_text_and_tune_k_uses_training_tokens_only():
    text = torch.tensor([0, 1, 2, 3] * 200)
    train, val = text[:700], text[700:]
    ks = ngram.tune_k(train, 3, 4)
    assert len(ks) == 3 and all(k in ngram.GRID for k in ks)
    losses = [ngram.cross_entropy(ngram.fit(train, n, 4, k), val) for n, k in zip((1, 2, 3), ks, strict=True)]
    assert losses[0] == pytest.approx(math.log(4), abs=0.01) and losses[1] < 0.05 and losses[2] < 0.05
    assert ngram.tune_k(torch.cat([train, torch.tensor([3, 2, 1, 0] * 20)])[:700], 3, 4) == ks  # same tokens


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="ids must be a 1-D"):
        ngram.fit(torch.tensor([0, 9]), 1, 5, 1.0)
    with pytest.raises(ValueError, match="int64"):
        ngram.fit(torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8]), 8, 256, 1.0)
    with pytest.raises(ValueError, match="k >= 0"):
        ngram.fit(torch.tensor([0, 1]), 1, 5, -1.0)
    with pytest.raises(ValueError, match="n <= 2"):
        ngram.fit(torch.tensor([0, 1, 1]), 2, 5, 1.0).order(3, 1.0)


def test_distinct_counts_the_rows_of_each_table():
    m = ngram.fit(torch.tensor([0, 1, 0, 1, 2]), 3, 3, 1.0)
    assert [m.distinct(n) for n in (1, 2, 3)] == [3, 3, 3]  # {0, 1, 2}; {01, 10, 12}; {010, 101, 012}
