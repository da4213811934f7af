"""Chapter 08's diagrams: :func:`lora_adapter`."""

from __future__ import annotations

from ._kit import (
    FOCUS,
    FROZEN,
    SMALL,
    TITLE,
    WIDTH,
    _canvas,
    _int,
    _matrix,
    _tint,
)


def lora_adapter(d_in: int = 8, d_out: int = 8, R: int = 2):
    """The frozen weight ``W`` (``d_out x d_in``, grey) beside the trained low-rank update
    ``B (d_out x R) @ A (R x d_in)``, drawn to scale, under ``h = W x + (alpha / R) B A x``
    (Hu et al., 2021, in the paper's column-vector layout; ``course_lib.lora`` stores the
    transposes, ``h = x W + s x A B`` with ``A (D_in x R)`` and ``B (R x D_out)``). ``B`` starts
    at zero, so the adapted model starts as the pretrained one; ``A`` starts random.
    ``d_in``, ``d_out`` in 1 .. 64, ``R`` in 1 .. min(d_in, d_out)."""
    _int("d_in", d_in, 1, 64)
    _int("d_out", d_out, 1, 64)
    if isinstance(R, bool) or not isinstance(R, int) or not 1 <= R <= min(d_in, d_out):
        raise ValueError(f"R must be an int in 1 .. min(d_in, d_out) = {min(d_in, d_out)} (a rank above "
                         f"that saves nothing), got {R!r}")
    u = min(0.2, 1.8 / max(d_in, d_out))  # inches per entry: every matrix to the same scale
    fig, ax = _canvas()
    ax.text(WIDTH - 0.15, 3.15, r"$h = W\,x + \frac{\alpha}{R}\,B\,A\,x$", ha="right", va="center",
            fontsize=14)
    top, trained = 2.8, _tint(FOCUS, 0.55)
    w_x, b_x = 1.5 - d_in * u / 2, 3.5  # W centred in its column; B, then A, from a fixed left edge
    a_x = b_x + R * u + 0.15
    for name, x, rows, cols in (("W", w_x, d_out, d_in), ("B", b_x, d_out, R), ("A", a_x, R, d_in)):
        _matrix(ax, x, top, rows, cols, u, FROZEN if name == "W" else FOCUS,
                _tint(FROZEN, 0.5) if name == "W" else trained)
        ax.text(x + cols * u / 2, top + 0.05, name, ha="center", va="bottom", fontsize=TITLE, weight="bold")
    ax.text(1.5, top - d_out * u - 0.1, f"W: d_out × d_in = {d_out} × {d_in}\nfrozen (pretrained)",
            ha="center", va="top", fontsize=SMALL)
    ax.text(2.65, top - d_out * u / 2, r"$+\ \frac{\alpha}{R}$", fontsize=14, va="center")
    ax.text(b_x, top - d_out * u - 0.1, f"B: d_out × R = {d_out} × {R}, trained, starts at 0\n"
            f"A: R × d_in = {R} × {d_in}, trained, starts random", va="top", fontsize=SMALL)
    ax.text(0.15, 0.45, f"trained: R (d_in + d_out) = {R * (d_in + d_out)} numbers;   frozen: d_in · d_out = "
            f"{d_in * d_out}", va="center", fontsize=SMALL)
    ax.text(0.15, 0.2, "B = 0 at the start, so h = W x: training starts from the pretrained model",
            fontsize=SMALL, va="center", style="italic")
    return fig
