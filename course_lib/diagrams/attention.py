"""Chapter 02's diagrams: :func:`attention_masks`, :func:`multi_head_split`, :func:`gqa_sharing`,
:func:`kv_cache`."""

from __future__ import annotations

from ._kit import (
    ATTENTION,
    BLUE,
    CYCLE,
    FONT,
    FROZEN,
    GREEN,
    GREY,
    HEIGHT,
    INK,
    ORANGE,
    PALE,
    SMALL,
    TITLE,
    WIDTH,
    _arrow,
    _box,
    _canvas,
    _cells,
    _int,
    _matrix,
    _plural,
    _tint,
)


def attention_masks(S: int = 6, window: int = 3, n_pad: int = 2):
    """Three ``S x S`` masks from ``course_lib.attention.masks``: causal, causal with a sliding
    window of ``window`` keys (the query's own included) and padding (the last ``n_pad`` keys are
    pad tokens; every query, padded ones too, ignores them). Rows are queries, columns keys;
    filled cells may attend, hatched blank cells are masked. ``S`` in 1 .. 16."""
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Patch

    from ..attention import masks

    _int("S", S, 1, 16)
    _int("window", window, 1, S)
    _int("n_pad", n_pad, 0, S - 1)
    grids = [
        ("causal", masks.causal_mask(S)),
        (f"causal + sliding window of {window}", masks.sliding_window_mask(S, window)),
        (f"padding: last {n_pad} keys", masks.padding_mask(torch.tensor([S - n_pad]), S)[0, 0]
         .expand(S, S)),  # (1, 1, 1, Sk) -> (S, Sk): the same keys masked for every query
    ]
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH, HEIGHT))
    for ax, (title, mask) in zip(axes, grids, strict=True):
        _cells(ax, mask.tolist(), 0, S, 1.0, ATTENTION)  # query 0 at the top, as the matrix is written
        ax.set_xlim(0, S)
        ax.set_ylim(0, S)
        ax.set_aspect("equal")
        every = 1 if S <= 10 else 3  # tick labels stay apart
        ax.set_xticks([j + 0.5 for j in range(0, S, every)], range(0, S, every))
        ax.set_yticks([S - i - 0.5 for i in range(0, S, every)], range(0, S, every))
        ax.tick_params(labelsize=SMALL, length=0)
        ax.set_title(title, fontsize=FONT)
        ax.set_xlabel("key position", fontsize=FONT)
        ax.set_ylabel("query position", fontsize=FONT)
    fig.legend(handles=[Patch(facecolor=ATTENTION, label="may attend (filled)"),
                        Patch(facecolor="white", edgecolor=GREY, hatch="////", label="masked (hatched)")],
               loc="lower center", ncol=2, fontsize=SMALL, frameon=False)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.2, top=0.9, wspace=0.35)  # tight_layout is slow
    return fig


def multi_head_split(H: int = 4, Dh: int = 3):
    """One sequence's ``(S, D)`` activation with ``D = H * Dh`` columns cut into ``H`` slices of
    ``Dh``, each slice going to its own head: ``(B, S, D) -> (B, S, H, Dh)`` by a view, then
    ``-> (B, H, S, Dh)`` by a transpose, so that the heads become a batch dimension.
    ``H`` in 1 .. 16, ``Dh`` in 1 .. 16, ``D`` at most 64."""
    _int("H", H, 1, 16)
    _int("Dh", Dh, 1, 16)
    D, S = H * Dh, 4
    if D > 64:
        raise ValueError(f"D = H * Dh must be at most 64 to draw, got {H} * {Dh} = {D}")
    fig, ax = _canvas()
    ax.text(WIDTH / 2, 3.28, "(B, S, D)   — view →   (B, S, H, Dh)   — transpose(1, 2) →   (B, H, S, Dh)",
            ha="center", va="center", fontsize=TITLE, weight="bold")
    gap = 0.15
    cell = min(0.22, 5.2 / D, (7.2 - gap * (H - 1)) / D)  # the wide grid and the H narrow ones both fit
    x0, top = (WIDTH - D * cell) / 2, 2.8
    bottom = top - S * cell
    heads_top, heads_x0 = 1.5, (WIDTH - (D * cell + gap * (H - 1))) / 2
    for h in range(H):
        color = CYCLE[h % len(CYCLE)]
        _matrix(ax, x0 + h * Dh * cell, top, S, Dh, cell, color, _tint(color, 0.5))
        hx = heads_x0 + h * (Dh * cell + gap)
        _matrix(ax, hx, heads_top, S, Dh, cell, color, _tint(color, 0.5))
        label = f"head {h}" if Dh * cell + gap >= 0.6 else f"h{h}"  # narrow heads get short names
        ax.text(hx + Dh * cell / 2, heads_top - S * cell - 0.13, label, ha="center", va="top", fontsize=SMALL)
        _arrow(ax, (x0 + (h + 0.5) * Dh * cell, bottom - 0.05), (hx + Dh * cell / 2, heads_top + 0.05),
               color=color)
    ax.text(x0 - 0.15, top - S * cell / 2, f"x: (S, D)\nS = {S} positions", ha="right", va="center",
            fontsize=FONT)
    ax.text(x0 + D * cell + 0.15, top - S * cell / 2, f"D = H × Dh\n   = {H} × {Dh} = {D}", ha="left",
            va="center", fontsize=FONT)
    ax.text(x0 + Dh * cell / 2, top + 0.1, f"Dh = {Dh}", ha="center", va="bottom", fontsize=SMALL)
    ax.text(WIDTH / 2, 0.12, f"H = {_plural(H, 'head')}, each (S, Dh): every head attends over all S "
            "positions with its own Dh columns", ha="center", va="center", fontsize=SMALL)
    return fig


def gqa_sharing(H: int = 8, Hkv: int = 2):
    """``H`` query heads above ``Hkv`` key/value heads, lines joining each query head to the
    key/value head it reads: groups of ``G = H // Hkv``. ``Hkv = H`` is multi-head attention
    (MHA), ``Hkv = 1`` multi-query attention (MQA), anything between grouped-query (GQA).
    ``H`` in 1 .. 16 and ``Hkv`` dividing it, else ValueError."""
    _int("H", H, 1, 16)
    _int("Hkv", Hkv, 1, H)
    if H % Hkv:
        raise ValueError(f"H must be a multiple of Hkv (each kv head serves G = H / Hkv query heads), "
                         f"got H={H}, Hkv={Hkv}")
    G = H // Hkv
    kind = ("MHA: multi-head attention" if Hkv == H else "MQA: multi-query attention" if Hkv == 1
            else "GQA: grouped-query attention")
    fig, ax = _canvas()
    ax.text(WIDTH / 2, 3.25, f"{kind}:  H = {H},  Hkv = {Hkv},  G = H / Hkv = {G}",
            ha="center", va="center", fontsize=TITLE, weight="bold")
    left, right, q_y, kv_y = 2.0, 7.8, 2.45, 1.05
    pitch = (right - left) / H
    qx = [left + (h + 0.5) * pitch for h in range(H)]
    ax.text(left - 0.2, q_y, f"query heads\n(H = {H})", ha="right", va="center", fontsize=FONT)
    ax.text(left - 0.2, kv_y, f"key/value heads\n(Hkv = {Hkv})", ha="right", va="center", fontsize=FONT)
    for g in range(Hkv):
        color = CYCLE[g % len(CYCLE)]
        members = range(g * G, (g + 1) * G)  # query head h reads kv head h // G
        cx = sum(qx[h] for h in members) / G
        _box(ax, cx, kv_y, min(G * pitch * 0.9, 1.6, max(0.7, G * 0.5)), 0.42, f"kv{g}", color, weight="bold")
        for h in members:
            _box(ax, qx[h], q_y, min(pitch * 0.8, 0.7), 0.38, f"q{h}", color)
            ax.plot([qx[h], cx], [q_y - 0.19, kv_y + 0.21], color=color, linewidth=1.4, zorder=1)
        if G > 1:
            ax.text(cx, kv_y - 0.38, f"group {g}: q{g * G}–q{(g + 1) * G - 1}", ha="center", va="center",
                    fontsize=SMALL)
    ax.text(WIDTH / 2, 0.2, f"G = {_plural(G, 'query head')} per key/value head: K, V and the KV cache "
            f"have Hkv = {_plural(Hkv, 'head')} instead of H = {H}, {G}× smaller", ha="center", va="center",
            fontsize=SMALL)
    return fig


def kv_cache(step: int = 4):
    """One decoding step with a KV cache: keys and values of positions ``0 .. step - 1`` are
    cached (grey, computed at earlier steps); the new token ``step`` gets its ``q``, ``k``, ``v``
    (coloured), ``k`` and ``v`` are appended to the cache, and ``q`` meets each of the ``step + 1``
    keys in one score. The output is the values weighted by the softmax of those scores: the arrows
    into it come from the scores and the values. ``step`` in 1 .. 9."""
    _int("step", step, 1, 9)
    n = step + 1
    fig, ax = _canvas()
    ax.text(0.15, 3.3, f"Decoding step {step}: one new token, {_plural(step, 'cached position')}",
            fontsize=TITLE, weight="bold", va="center")
    k_y, v_y, h = 2.3, 1.05, 0.38
    pitch = min(0.62, 3.1 / n)
    cx = [3.1 + (j + 0.5) * pitch for j in range(n)]
    for j in range(n):
        new = j == step
        _box(ax, cx[j], k_y, pitch * 0.88, h, f"k{j}", ORANGE if new else FROZEN, fill=None if new else PALE,
             lw=2 if new else 1)
        _box(ax, cx[j], v_y, pitch * 0.88, h, f"v{j}", GREEN if new else FROZEN, fill=None if new else PALE,
             lw=2 if new else 1)
    ax.text(cx[0] - pitch / 2 - 0.1, k_y, "K cache", ha="right", va="center", fontsize=FONT)
    ax.text(cx[0] - pitch / 2 - 0.1, v_y, "V cache", ha="right", va="center", fontsize=FONT)
    # the new token: x -> q (to the scores), k (appended above), v (appended below)
    tok_x, q_x, mid = 0.6, 1.85, (k_y + v_y) / 2
    _box(ax, tok_x, mid, 0.9, 0.5, f"new token\nx{step}", INK, fill="white")
    _box(ax, q_x, mid, 0.55, h, f"q{step}", BLUE, lw=2)
    _arrow(ax, (tok_x + 0.45, mid), (q_x - 0.275, mid))
    _box(ax, cx[step], 3.0, pitch * 0.88, h, f"k{step}", ORANGE, lw=2)
    _box(ax, cx[step], 0.35, pitch * 0.88, h, f"v{step}", GREEN, lw=2)
    _arrow(ax, (tok_x, mid + 0.25), (tok_x, 3.0), (cx[step] - pitch * 0.44, 3.0))
    _arrow(ax, (tok_x, mid - 0.25), (tok_x, 0.35), (cx[step] - pitch * 0.44, 0.35))
    _arrow(ax, (cx[step], 3.0 - h / 2), (cx[step], k_y + h / 2))
    _arrow(ax, (cx[step], 0.35 + h / 2), (cx[step], v_y - h / 2))
    ax.text(cx[step] + pitch / 2 + 0.05, 2.7, "append", fontsize=SMALL, va="center")
    ax.text(cx[step] + pitch / 2 + 0.05, 0.7, "append", fontsize=SMALL, va="center")
    # the scores: one per key, s_j = q . k_j / sqrt(Dh), in a row between the caches
    s_h = 0.3
    for j in range(n):
        _box(ax, cx[j], mid, pitch * 0.88, s_h, f"s{j}", BLUE, fill="white", fontsize=SMALL)
        _arrow(ax, (cx[j], k_y - h / 2), (cx[j], mid + s_h / 2))  # the key enters its score
    _arrow(ax, (q_x + 0.275, mid), (cx[0] - pitch * 0.44, mid), color=BLUE)  # q enters every score
    gap = (q_x + 0.275 + cx[0] - pitch * 0.44) / 2  # between q and the first score
    ax.text(gap, mid + 0.1, f"q{step} · kj / √Dh", fontsize=SMALL, ha="center", va="bottom", color=INK)
    ax.text(gap, mid - 0.1, f"j = 0 … {step}", fontsize=SMALL, ha="center", va="top", color=INK)
    # the output: the softmax of the scores weighs the values
    out_x, out_h = 7.25, 0.8
    _box(ax, out_x, mid, 1.4, out_h, f"output o{step} = Σj aj vj\naj: softmax\nof the {n} scores", INK,
         fill="white", fontsize=SMALL)
    _arrow(ax, (cx[-1] + pitch * 0.44, mid), (out_x - 0.7, mid))
    _arrow(ax, (cx[-1] + pitch / 2, v_y), (out_x, v_y), (out_x, mid - out_h / 2))
    ax.text(WIDTH - 0.1, 3.0, "grey: cached, reused\ncoloured: computed now", ha="right", va="center",
            fontsize=SMALL)
    return fig
