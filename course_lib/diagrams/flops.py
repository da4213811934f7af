"""Chapter 05's diagrams: :func:`block_flops`."""

from __future__ import annotations

from ._kit import (
    ATTENTION,
    FONT,
    GREY,
    MLP,
    SMALL,
    TITLE,
    _box,
    _canvas,
    _int,
    _si,
)


def _block_flop_terms(D: int, S: int, F: int) -> list[tuple[str, str, int]]:
    """(name, formula, FLOPs per token) of one block's forward matmuls, 2 FLOPs per multiply-add."""
    return [
        ("Q, K, V projections", "2 · 3 · D · D", 2 * 3 * D * D),
        ("attention scores Q Kᵀ", "2 · S · D", 2 * S * D),
        ("weighted sum A V", "2 · S · D", 2 * S * D),
        ("output projection", "2 · D · D", 2 * D * D),
        ("MLP up + down", "2 · 2 · D · F", 2 * 2 * D * F),
    ]


def block_flops(d_model: int = 768, seq_len: int = 1024, n_heads: int = 12, d_ff: int | None = None):
    """Forward FLOPs per token of one transformer block, one bar per matmul group with its
    formula, value and share (bar length proportional to the share), and the total.

    Conventions are ``course_lib.flops.flops_per_token``'s: a matmul costs 2 FLOPs per
    multiply-add; norms, softmax, biases and activations (``O(D)`` each) are left out; the
    attention terms count all ``S`` keys per query, as the code computes them before the causal
    mask (a kernel that skips the masked half does about half). With multi-head attention and a
    GELU MLP the total equals ``flops_per_token`` of a one-layer model minus its unembedding.
    ``n_heads`` only has to divide ``d_model``: ``H`` heads of ``Dh`` cost the same as one of
    ``D``. ``d_ff`` defaults to ``F = 4 D``. Training costs about 3 times this (backward about 2x).
    """
    _int("d_model", d_model, 1, 10**6)
    _int("seq_len", seq_len, 1, 10**8)
    _int("n_heads", n_heads, 1, d_model)
    if d_model % n_heads:
        raise ValueError(f"d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
    F = 4 * d_model if d_ff is None else _int("d_ff", d_ff, 1, 10**7)
    terms = _block_flop_terms(d_model, seq_len, F)
    total = sum(v for _, _, v in terms)
    fig, ax = _canvas()
    ax.text(0.15, 3.25, f"Forward FLOPs per token, one block:  D = {d_model},  S = {seq_len},  F = {F},  "
            f"H = {n_heads} (Dh = {d_model // n_heads})", fontsize=TITLE, weight="bold", va="center")
    x0, longest = 3.35, max(v for _, _, v in terms)
    for i, (name, formula, value) in enumerate(terms):
        y = 2.75 - i * 0.45
        color = MLP if name.startswith("MLP") else ATTENTION
        ax.text(0.15, y, name, va="center", fontsize=FONT)
        ax.text(x0 - 0.15, y, formula, ha="right", va="center", fontsize=FONT)
        w = 3.1 * value / longest  # length proportional to the share of the total
        _box(ax, x0 + w / 2, y, w, 0.32, "", color)
        ax.text(x0 + w + 0.1, y, f"{value:,}  ({100 * value / total:.1f}%)", va="center", fontsize=SMALL)
    y = 2.75 - len(terms) * 0.45
    ax.plot([0.15, 7.85], [y + 0.2, y + 0.2], color=GREY, linewidth=0.8)
    ax.text(0.15, y - 0.02, f"total {total:,} FLOPs per token ({_si(total)}FLOP)", va="center", fontsize=FONT,
            weight="bold")
    ax.text(0.15, y - 0.38, f"training ≈ 3 × forward (backward ≈ 2 × forward) ≈ {_si(3 * total)}FLOP "
            "per token per block;  blue: attention, orange: MLP", va="center", fontsize=SMALL)
    return fig
