"""Chapter 06's diagrams: :func:`isoflop_explained`."""

from __future__ import annotations

import math

from ._kit import (
    FONT,
    HEIGHT,
    INK,
    LINES,
    SMALL,
    TITLE,
    WIDTH,
)


def _power_of_ten(x: float) -> str:
    """``$10^{18}$`` for powers of ten, ``$3 \\times 10^{18}$`` otherwise (mathtext)."""
    e = math.floor(math.log10(x))
    m = x / 10**e
    return f"$10^{{{e}}}$" if abs(m - 1) < 1e-9 else f"${m:.2g} \\times 10^{{{e}}}$"


def isoflop_explained(budgets=(1e18, 1e19, 1e20)):
    """IsoFLOP curves of ``course_lib.scaling.ChinchillaLaw``: for each compute budget ``C``, the
    loss of a model of ``N`` parameters trained on ``D = C / (6 N)`` tokens, against ``N`` (log
    axis). Each curve's minimum (the law's closed-form ``compute_optimal``) is marked; the minima
    are joined by a dashed line, labelled "compute-optimal N grows with C". ``budgets``: 1 to 6
    distinct positive FLOP counts (drawn in increasing order). Here ``D`` is tokens, as in the
    papers, not d_model."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..scaling import ChinchillaLaw

    try:
        budgets = sorted(float(c) for c in budgets)
    except (TypeError, ValueError):
        raise ValueError(f"budgets must be a sequence of numbers (FLOPs), got {budgets!r}") from None
    if not 1 <= len(budgets) <= len(LINES) or not all(math.isfinite(c) and c > 0 for c in budgets) \
            or len(set(budgets)) != len(budgets):
        raise ValueError(f"budgets must be 1 to {len(LINES)} distinct positive finite FLOP counts, "
                         f"got {budgets!r}")
    law = ChinchillaLaw()
    optima = [law.compute_optimal(C)[0] for C in budgets]
    N = np.logspace(math.log10(optima[0] / 30), math.log10(optima[-1] * 30), 300)
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    best = [law.loss(n, C / (6 * n)) for n, C in zip(optima, budgets, strict=True)]
    curves, lowest, highest = [], math.inf, -math.inf
    for C, n_opt, l_opt, color in zip(budgets, optima, best, LINES, strict=False):
        loss = np.array([law.loss(n, C / (6 * n)) for n in N])
        keep = loss < l_opt + 0.6  # the valley, not the walls
        curves += ax.plot(N[keep], loss[keep], color=color, linewidth=2,
                          label=f"C = {_power_of_ten(C)} FLOPs")
        ax.plot([n_opt], [l_opt], "o", color=color, markersize=7, markeredgecolor=INK, zorder=3)
        lowest, highest = min(lowest, loss[keep].min()), max(highest, loss[keep].max())
    ax.plot(optima, best, "--", color=INK, linewidth=1.3, label="compute-optimal N grows with C")
    mid = len(optima) // 2 if len(optima) % 2 else len(optima) // 2 - 1  # a point on the line, not its end
    at = (math.sqrt(optima[mid] * optima[min(mid + 1, len(optima) - 1)]),
          (best[mid] + best[min(mid + 1, len(best) - 1)]) / 2)
    ax.annotate("compute-optimal N grows with C", xy=at, xytext=(8, 4), textcoords="offset points",
                ha="left", va="bottom", fontsize=SMALL)
    ax.set_xscale("log")
    ax.set_ylim(lowest - 0.15, highest + 0.05)
    ax.set_xlabel("parameters N", fontsize=FONT)
    ax.set_ylabel("loss (nats per token)", fontsize=FONT)
    ax.set_title("IsoFLOP curves: fixed compute C, tokens D = C / (6 N)", fontsize=TITLE)
    ax.tick_params(labelsize=SMALL)
    ax.text(0.01, 0.03, "← too few parameters", transform=ax.transAxes, fontsize=SMALL)
    ax.text(0.99, 0.03, "too few tokens →", transform=ax.transAxes, fontsize=SMALL, ha="right")
    ax.legend(handles=curves, fontsize=SMALL, loc="upper right", frameon=False)
    fig.tight_layout()
    return fig
