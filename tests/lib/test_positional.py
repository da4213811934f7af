"""Tests for course_lib.positional.

References: the sinusoidal formula evaluated in a plain Python loop, a direct complex-number
RoPE (Meta's ``x * e^{i m theta}`` on interleaved pairs), which ``pairing="interleaved"`` must
equal as it is and the default ``"halves"`` after the half-split permutation, and RoPE's
defining properties in both pairings (norms kept, scores depend on relative position only).
"""

from __future__ import annotations

import math

import pytest
import torch

from course_lib import positional as P


# --------------------------------------------------------------------------- sinusoidal
@pytest.mark.parametrize("S,D,base", [(1, 2, 10000.0), (7, 6, 10000.0), (50, 16, 10000.0), (9, 8, 100.0)])
def test_sinusoidal_matches_the_formula_in_a_loop(S, D, base):
    want = torch.zeros(S, D, dtype=torch.float64)
    for t in range(S):
        for i in range(D // 2):
            want[t, 2 * i] = math.sin(t / base ** (2 * i / D))
            want[t, 2 * i + 1] = math.cos(t / base ** (2 * i / D))
    got = P.sinusoidal(S, D, base)
    assert got.shape == (S, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, want.float())
    assert P.sinusoidal(S, D, base, dtype=torch.float64).dtype == torch.float64


def test_sinusoidal_shift_is_a_rotation_per_frequency_pair():
    D, shift = 8, 5
    pe = P.sinusoidal(40, D).double()
    for i in range(D // 2):
        w = 1 / 10000 ** (2 * i / D)
        c, s = math.cos(shift * w), math.sin(shift * w)
        # [sin(a + b), cos(a + b)] = [[cos b, sin b], [-sin b, cos b]] @ [sin a, cos a]
        rot = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
        pair = pe[:, 2 * i:2 * i + 2]  # (S, 2)
        torch.testing.assert_close(pair[:-shift] @ rot.T, pair[shift:], atol=1e-6, rtol=1e-6)


def test_sinusoidal_odd_width_is_an_error():
    with pytest.raises(ValueError, match="even d_model.*got 5"):
        P.sinusoidal(4, 5)


# --------------------------------------------------------------------------- learned
def test_learned_positional_shapes_and_range():
    pos = P.LearnedPositional(6, 4)
    assert pos(torch.arange(6)).shape == (6, 4)
    assert pos(torch.arange(3).expand(2, 3)).shape == (2, 3, 4)
    torch.testing.assert_close(pos(torch.tensor([2])), pos.embedding.weight[2:3])
    with pytest.raises(ValueError, match=r"0 .. 5 \(context_length=6\), got min 0, max 6"):
        pos(torch.arange(7))
    with pytest.raises(ValueError, match="got min -1"):
        pos(torch.tensor([-1]))


# --------------------------------------------------------------------------- rotary
def _complex_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Meta's Llama formulation: interleaved pairs (x0, x1), (x2, x3) as complex numbers."""
    Dh = x.shape[-1]
    theta = base ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    rot = torch.polar(torch.ones(len(positions), Dh // 2, dtype=torch.float64),
                      positions.double()[:, None] * theta)  # e^{i m theta}
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], Dh // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2)


def _to_halves(x):  # interleaved (x0, x1, x2, x3, ...) -> (x0, x2, ..., x1, x3, ...)
    return torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)


@pytest.mark.parametrize("Dh", [2, 8, 16])
def test_rope_matches_complex_number_rope_after_the_half_split_permutation(Dh):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, Dh)
    positions = torch.tensor([0, 1, 2, 5, 9, 17, 100, 1000, 3, 4, 4096])
    want = _to_halves(_complex_rope(x, positions))
    got = P.RotaryEmbedding(Dh)(_to_halves(x), positions)
    # angles are fp32 (as in Llama/HF): at position ~4096 that costs ~1e-4 in absolute error
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("Dh", [2, 8, 16])
def test_interleaved_rope_matches_complex_number_rope_as_it_is(Dh):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, Dh)
    positions = torch.tensor([0, 1, 2, 5, 9, 17, 100, 1000, 3, 4, 4096])
    got = P.RotaryEmbedding(Dh, pairing="interleaved")(x, positions)
    torch.testing.assert_close(got.double(), _complex_rope(x, positions), atol=2e-4, rtol=1e-4)
    base = P.RotaryEmbedding(Dh, base=500.0, pairing="interleaved")(x, positions)  # another base
    torch.testing.assert_close(base.double(), _complex_rope(x, positions, 500.0), atol=2e-4, rtol=1e-4)


def test_the_two_pairings_differ_except_with_one_pair():
    torch.manual_seed(0)
    x, positions = torch.randn(5, 8), torch.arange(5)
    halves, interleaved = P.RotaryEmbedding(8), P.RotaryEmbedding(8, pairing="interleaved")
    assert not torch.allclose(halves(x, positions), interleaved(x, positions), atol=1e-3)
    torch.testing.assert_close(halves(x, positions), _to_halves(interleaved(_from_halves(x), positions)))
    two = torch.randn(5, 2)  # Dh = 2: one pair, (x0, x1) in both layouts
    torch.testing.assert_close(P.RotaryEmbedding(2)(two, positions),
                               P.RotaryEmbedding(2, pairing="interleaved")(two, positions))


def _from_halves(x):  # the inverse of _to_halves
    h = x.shape[-1] // 2
    return torch.stack([x[..., :h], x[..., h:]], dim=-1).flatten(-2)


def test_rotate_pairs_and_rotate_half_turn_each_pair_by_90_degrees():
    x = torch.arange(1.0, 9.0)  # 1 .. 8
    assert P.rotate_half(x).tolist() == [-5, -6, -7, -8, 1, 2, 3, 4]
    assert P.rotate_pairs(x).tolist() == [-2, 1, -4, 3, -6, 5, -8, 7]
    for turn in (P.rotate_half, P.rotate_pairs):
        torch.testing.assert_close(turn(turn(x)), -x)  # two quarter turns: a half turn
        assert float(turn(x) @ x) == 0.0  # each pair turned by 90 degrees is orthogonal to itself


@pytest.mark.parametrize("pairing", ["halves", "interleaved"])
def test_rope_preserves_norms_and_scores_depend_only_on_relative_position(pairing):
    torch.manual_seed(0)
    rope = P.RotaryEmbedding(16, pairing=pairing)
    q, k = torch.randn(16), torch.randn(16)
    x = torch.randn(4, 9, 16)
    torch.testing.assert_close(rope(x, torch.arange(9) * 7).norm(dim=-1), x.norm(dim=-1))

    def score(m, n):
        return (rope(q[None], torch.tensor([m])) * rope(k[None], torch.tensor([n]))).sum().item()

    for offset in (0, 1, 3, -4, 50):
        values = [score(m, m - offset) for m in (offset + 0, offset + 5, offset + 17, offset + 200)]
        assert max(values) - min(values) < 1e-4, (offset, values)
    assert abs(score(5, 3) - score(5, 4)) > 1e-3  # and it does depend on the offset


@pytest.mark.parametrize("pairing", ["halves", "interleaved"])
def test_rope_batched_positions_dtype_and_errors(pairing):
    torch.manual_seed(0)
    rope = P.RotaryEmbedding(8, pairing=pairing)
    x = torch.randn(2, 3, 5, 8)  # (B, H, S, Dh)
    pos = torch.stack([torch.arange(5), torch.arange(5) + 10])  # (B, S)
    got = rope(x, pos)
    torch.testing.assert_close(got[0], rope(x[0], pos[0]))
    torch.testing.assert_close(got[1], rope(x[1], pos[1]))
    torch.testing.assert_close(rope(x[:, 0], pos)[1], rope(x[1, 0], pos[1]))  # (B, S, Dh) too
    assert rope(x.bfloat16(), pos).dtype == torch.bfloat16
    torch.testing.assert_close(rope(x, torch.zeros(5, dtype=torch.long)), x)  # position 0: identity
    with pytest.raises(ValueError, match="even head_dim.*got 7"):
        P.RotaryEmbedding(7)
    with pytest.raises(ValueError, match="pairing must be one of .*'halves', 'interleaved'.*got 'neox'"):
        P.RotaryEmbedding(8, pairing="neox")
    with pytest.raises(ValueError, match="head_dim=8"):
        rope(torch.randn(5, 6), torch.arange(5))
    with pytest.raises(ValueError, match=r"S = x.shape\[-2\] = 5"):
        rope(x, torch.arange(4))
