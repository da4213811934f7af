"""Chapter 07's diagrams: :func:`moe_routing`."""

from __future__ import annotations

import math

from ._kit import (
    CYCLE,
    GREY,
    INK,
    PALE,
    SMALL,
    TITLE,
    _arrow,
    _box,
    _canvas,
    _int,
    _plural,
    _tint,
)


def moe_routing(n_tokens: int = 6, E: int = 4, K: int = 1, capacity_factor: float = 1.0, seed: int = 0):
    """Tokens, a router and ``E`` experts with ``ceil(capacity_factor * n_tokens * K / E)`` slots
    each. The router is ``course_lib.moe.routing.route`` on logits drawn from a seeded
    ``torch.Generator`` (so the picture is the same every time); seats go first come, first served,
    first choices before second ones. Each choice is an arrow from its token to its expert; a
    choice that finds its expert full is dashed and labelled "dropped" (the token then passes the
    layer on the residual stream alone). The default seed drops one token.
    ``n_tokens`` in 1 .. 12, ``E`` in 1 .. 8, ``K`` in 1 .. E, ``capacity_factor`` > 0."""
    import torch

    from ..moe.routing import expert_capacity, route

    _int("n_tokens", n_tokens, 1, 12)
    _int("E", E, 1, 8)
    _int("K", K, 1, E)
    _int("seed", seed, 0, 2**63 - 1)
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) \
            or not 0 < capacity_factor < math.inf:
        raise ValueError(f"capacity_factor must be a positive number, got {capacity_factor!r}")
    capacity = expert_capacity(n_tokens, E, K, capacity_factor)
    logits = torch.randn(n_tokens, E, generator=torch.Generator().manual_seed(seed))  # (T, E)
    routing = route(logits, top_k=K, capacity=capacity)
    experts, kept = routing.experts.tolist(), routing.kept.tolist()  # (T, K) each

    fig, ax = _canvas()
    ax.text(0.15, 3.3, f"Top-{K} routing, E = {E} experts, capacity = ⌈{capacity_factor:g} · {n_tokens} · {K}"
            f" / {E}⌉ = {_plural(capacity, 'slot')} each", fontsize=TITLE, weight="bold", va="center")
    lo, hi = 0.45, 2.9
    ty = [hi - i * (hi - lo) / max(n_tokens - 1, 1) for i in range(n_tokens)]
    ey = [hi - 0.1 - e * (hi - lo - 0.2) / max(E - 1, 1) for e in range(E)] if E > 1 else [(hi + lo) / 2]
    _box(ax, 1.75, (hi + lo) / 2, 0.95, hi - lo + 0.35, "", GREY, fill=PALE, zorder=0.5)
    ax.text(1.75, (hi + lo) / 2, f"router:\ntop-{K} of\nsoftmax(x Wr)", ha="center", va="center",
            fontsize=SMALL, zorder=3, bbox=dict(facecolor=PALE, edgecolor="none", pad=2))
    for t, y in enumerate(ty):
        _box(ax, 0.55, y, 0.55, min(0.3, (hi - lo) / n_tokens), f"t{t}", INK, fill="white")
    slot = min(0.34, 2.0 / capacity)  # capacity >= 1: the factor is > 0 and ceil rounds up
    slots_x0 = 6.6 - capacity * slot  # the slots sit left of each expert box
    seated = [[] for _ in range(E)]
    for k in range(K):  # choice-major, as route seats them: every first choice before any second one
        for t in range(n_tokens):
            e = experts[t][k]
            color = CYCLE[e % len(CYCLE)]
            start = (0.83, ty[t])
            if kept[t][k]:
                seated[e].append(t)
                _arrow(ax, start, (slots_x0 - 0.05, ey[e]), color=color, lw=1.5 if k == 0 else 1.0)
            else:
                end = (start[0] + 0.6 * (slots_x0 - start[0]), start[1] + 0.6 * (ey[e] - start[1]))
                _arrow(ax, start, end, color=GREY, ls="--", lw=1.3)
                ax.text(end[0] + 0.05, end[1], f"dropped (expert {e} full)", va="center", fontsize=SMALL,
                        color=INK, bbox=dict(facecolor="white", edgecolor="none", pad=1))
    for e, y in enumerate(ey):
        color = CYCLE[e % len(CYCLE)]
        for s in range(capacity):
            t = seated[e][s] if s < len(seated[e]) else None
            _box(ax, slots_x0 + (s + 0.5) * slot, y, slot * 0.9, 0.3, "" if t is None else f"t{t}", color,
                 fill=_tint(color, 0.4) if t is not None else "white", fontsize=SMALL, zorder=2.5)
        _box(ax, 7.3, y, 1.2, min(0.5, (hi - lo) / E), f"expert {e}\nslots {len(seated[e])}/{capacity}",
             color, fontsize=SMALL)
    ax.text(0.15, 0.1, "a dropped token skips the experts: the layer passes it on the residual stream "
            "unchanged", fontsize=SMALL, va="center", style="italic")
    return fig
