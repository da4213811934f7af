"""Chapter 04's diagrams: :func:`norm_positions`."""

from __future__ import annotations

from ._kit import (
    ATTENTION,
    FOCUS,
    FONT,
    INK,
    MLP,
    NORM,
    PALE,
    SMALL,
    _arrow,
    _box,
    _canvas,
    _sublayer,
)


def norm_positions():
    """Post-norm (the original Transformer: ``x <- Norm(x + f(x))``) beside pre-norm (GPT-2 and
    later: ``x <- x + f(Norm(x))``), one block each with its attention and MLP. The identity path
    from the block's input to its output is highlighted: in pre-norm it crosses no norm, so the
    gradient reaches early layers unchanged; in post-norm every norm sits on it."""
    fig, ax = _canvas()
    reads = (0.55, 1.5)  # the same heights in both panels, so they compare row by row
    for x0, post in ((0.0, True), (4.0, False)):
        x = x0 + 1.25
        title = ("post-norm (original Transformer)\nx ← Norm(x + f(x))" if post
                 else "pre-norm (GPT-2 onwards)\nx ← x + f(Norm(x))")
        ax.text(x0 + 2.0, 3.2, title, ha="center", va="center", fontsize=FONT, weight="bold")
        ax.plot([x, x], [0.15, 2.65], color=FOCUS, linewidth=4, zorder=1, solid_capstyle="butt")
        _arrow(ax, (x, 2.6), (x, 2.8), color=FOCUS, lw=2)
        ax.text(x, 0.08, "block input", ha="center", va="center", fontsize=SMALL)
        ax.text(x, 2.88, "block output", ha="center", va="bottom", fontsize=SMALL)
        for y, (name, color) in zip(reads, (("attention", ATTENTION), ("MLP", MLP)), strict=True):
            boxes = [(x0 + 3.25, 1.0, name, color)] if post else [(x0 + 2.05, 0.6, "norm", NORM),
                                                                   (x0 + 3.25, 1.0, name, color)]
            y_plus = _sublayer(ax, x, y, boxes)
            if post:
                _box(ax, x, y_plus + 0.3, 0.7, 0.24, "norm", NORM, fontsize=SMALL, zorder=3)
        path = ("gradient path: through every norm" if post
                else "gradient path: identity, no norm")
        ax.text(x - 0.5, 1.4, path, rotation=90, ha="center", va="center", fontsize=SMALL, color=INK,
                weight="bold")
    ax.plot([4.0, 4.0], [0.1, 3.0], color=PALE, linewidth=1)
    return fig
