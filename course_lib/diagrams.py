"""Pictures of ideas, drawn by code: one function per picture, each returning its matplotlib Figure.

These are diagrams, not data plots (except :func:`isoflop_explained`, a real plot of a law): the
book and the notebooks call them so that a picture and the code it explains never disagree. Every
function draws a figure about 8 x 3.5 inches, readable at book width, in the Okabe-Ito palette
(safe for the common colour-vision deficiencies); colour is never the only carrier of meaning,
every part has a label. Letters as everywhere in the course: ``B`` batch, ``S`` query positions,
``Sk`` key positions, ``D`` d_model, ``H`` query heads, ``Hkv`` key/value heads, ``G = H // Hkv``,
``Dh`` head dim, ``F`` feed-forward width, ``V`` vocabulary, ``L`` layers, ``E`` experts, ``K``
experts per token, ``R`` LoRA rank.

============================  =======  ===========================================================
function                      chapter  picture
============================  =======  ===========================================================
:func:`bpe_merges`            01       the lecture's BPE example, one row per merge
:func:`attention_masks`       02       causal, sliding-window and padding masks as grids
:func:`multi_head_split`      02       ``(B, S, D) -> (B, S, H, Dh) -> (B, H, S, Dh)``
:func:`gqa_sharing`           02       which query heads share each key/value head (MHA, GQA, MQA)
:func:`kv_cache`              02       one decoding step with a KV cache
:func:`gpt_architecture`      03       a GPT from token ids to logits, sized by a ``ModelConfig``
:func:`transformer_families`  03       encoder-only, decoder-only, encoder-decoder
:func:`residual_stream`       03       blocks reading from and adding to the residual stream
:func:`norm_positions`        04       post-norm vs pre-norm and the identity (gradient) path
:func:`block_flops`           05       forward FLOPs per token of one block, by matmul
:func:`isoflop_explained`     06       Chinchilla IsoFLOP curves and their compute-optimal minima
:func:`moe_routing`           07       top-K routing with expert capacity and dropped tokens
:func:`lora_adapter`          08       frozen ``W`` beside the trained low-rank ``B A``
:func:`rlhf_pipeline`         09       SFT, reward model and PPO; DPO; RL with verifiable rewards
============================  =======  ===========================================================

matplotlib is imported inside the functions, as in :func:`course_lib.train.plot_history`:
importing course_lib draws nothing. Pure diagrams draw on one axes that covers the figure with
limits equal to the figure's size, so every coordinate below is in inches.
"""

from __future__ import annotations

import math
from collections import Counter

__all__ = ["bpe_merges", "gpt_architecture", "transformer_families", "residual_stream", "attention_masks",
           "multi_head_split", "gqa_sharing", "kv_cache", "norm_positions", "block_flops",
           "isoflop_explained", "moe_routing", "lora_adapter", "rlhf_pipeline"]

# Okabe & Ito (2008), "Color Universal Design": told apart with the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILLION = "#0072B2", "#E69F00", "#009E73", "#D55E00"
SKY, PINK, YELLOW = "#56B4E9", "#CC79A7", "#F0E442"
INK, GREY, PALE = "#222222", "#8C8C8C", "#EEEEEE"
CYCLE = (BLUE, ORANGE, GREEN, VERMILLION, PINK, SKY, YELLOW)  # for "one colour per head/expert/merge"
LINES = CYCLE[:-1]  # yellow is too pale for a thin line on white
# One meaning per colour across the pictures: attention blue, MLP orange, norms green, the thing to
# look at (new, trained, the gradient path) vermillion, frozen or cached grey.
ATTENTION, MLP, NORM, FOCUS, FROZEN = BLUE, ORANGE, GREEN, VERMILLION, GREY

FONT, SMALL, TITLE = 10, 9, 11  # points; 9 is the smallest that stays readable at book width
WIDTH, HEIGHT = 8.0, 3.5        # inches


# ---------------------------------------------------------------------------------------------
# Shared helpers: a canvas in inches, a labelled box, an arrow along points, a + node, mask cells,
# a matrix to scale, a sublayer beside a residual stream, argument checks.
# ---------------------------------------------------------------------------------------------

def _canvas(width: float = WIDTH, height: float = HEIGHT):
    """A figure with one frameless axes covering it, limits = size in inches (so aspect is 1)."""
    import matplotlib.pyplot as plt  # here, not at import: importing course_lib draws nothing

    fig = plt.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    return fig, ax


def _tint(color: str, amount: float = 0.3) -> str:
    """``amount`` of ``color`` mixed into white: light fills keep black text readable."""
    rgb = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(255 - amount * (255 - c)):02x}" for c in rgb)


def _box(ax, x, y, w, h, text="", color=GREY, *, fill=None, fontsize=FONT, lw=1.2, weight="normal",
         zorder=2):
    """A rounded box centred at ``(x, y)``, edged in ``color``, filled with its tint, with a label."""
    from matplotlib.patches import FancyBboxPatch

    patch = FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.05",
                           facecolor=_tint(color) if fill is None else fill, edgecolor=color,
                           linewidth=lw, zorder=zorder)
    ax.add_patch(patch)
    if text:
        ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=INK, weight=weight,
                zorder=zorder + 0.1, linespacing=1.15)
    return patch


def _arrow(ax, *points, color=INK, ls="-", lw=1.2, zorder=1.5):
    """An arrow along ``points`` (straight segments; the head at the last point)."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path

    ax.add_patch(FancyArrowPatch(path=Path(list(points)), arrowstyle="-|>", mutation_scale=11,
                                 color=color, linewidth=lw, linestyle=ls, zorder=zorder))


def _plus(ax, x, y, r=0.09):
    """A + node: where a sublayer's output is added back to the residual stream."""
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), r, facecolor="white", edgecolor=INK, linewidth=1.2, zorder=3))
    ax.text(x, y, "+", ha="center", va="center", fontsize=FONT, weight="bold", zorder=3.1)


def _cells(ax, allowed, x0, y_top, cell, color):
    """An attention mask as cells, rows = queries from the top: allowed filled, masked hatched blank."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    cells = {True: [], False: []}  # two collections, not one patch per cell: 16 x 16 grids stay fast
    for i, row in enumerate(allowed):
        for j, ok in enumerate(row):
            cells[bool(ok)].append(Rectangle((x0 + j * cell, y_top - (i + 1) * cell), cell, cell))
    ax.add_collection(PatchCollection(cells[True], facecolor=color, edgecolor="white", linewidth=0.6))
    ax.add_collection(PatchCollection(cells[False], facecolor="white", edgecolor=GREY, linewidth=0.6,
                                      hatch="////"))


def _matrix(ax, x0, y_top, rows, cols, u, color, fill):
    """A ``rows x cols`` matrix to scale (``u`` inches per entry), edged in ``color``, with white
    lines between entries while they stay visible."""
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((x0, y_top - rows * u), cols * u, rows * u, facecolor=fill, edgecolor=color,
                           linewidth=1.5, zorder=2))
    if u >= 0.06:
        lines = [[(x0, y_top - i * u), (x0 + cols * u, y_top - i * u)] for i in range(1, rows)]
        lines += [[(x0 + j * u, y_top), (x0 + j * u, y_top - rows * u)] for j in range(1, cols)]
        ax.add_collection(LineCollection(lines, colors="white", linewidths=0.8, zorder=2.1))


def _sublayer(ax, x, y, boxes, rise=0.3, h=0.24):
    """``x <- x + f(x)`` beside a vertical stream at ``x``: the branch leaves the stream at ``y``,
    runs right through ``boxes`` ((centre, width, label, colour), in order) and comes back over
    them into a + node ``rise`` higher. Returns the + node's height."""
    ax.plot([x], [y], "o", color=INK, markersize=4, zorder=3)  # the read point
    left = x
    for bx, w, label, color in boxes:
        _arrow(ax, (left, y), (bx - w / 2, y))
        _box(ax, bx, y, w, h, label, color, fontsize=SMALL)
        left = bx + w / 2
    last = boxes[-1][0]
    _arrow(ax, (last, y + h / 2), (last, y + rise), (x + 0.09, y + rise))
    _plus(ax, x, y + rise)
    return y + rise


def _int(name: str, value, lo: int, hi: int) -> int:
    """``value`` if it is an int in ``lo .. hi``, else a ValueError naming what was expected."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo} .. {hi}, got {value!r}")
    return value


def _plural(n: int, word: str) -> str:
    """``1 slot``, ``2 slots``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _si(x: float) -> str:
    """``17.3 M`` style: three significant digits and an SI prefix."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}"
    return f"{x:.3g} "


# ---------------------------------------------------------------------------------------------
# Chapter 01
# ---------------------------------------------------------------------------------------------

def _bpe_rows(text: str) -> list[tuple[str, str]]:
    """(string, rule) after each merge: the most frequent adjacent pair (overlaps counted, as
    ``course_lib.bpe.get_pair_counts``), ties to the lowest (id0, id1) as ``course_lib.bpe.train``
    (a character's id is its code point, new symbols come after every character), until no pair
    occurs twice. New symbols are Z, Y, X, ... skipping letters the text uses."""
    fresh = [c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBA" if c not in text]
    rank = {c: ord(c) for c in text}
    seq, rows = list(text), [(text, "start")]
    while True:
        counts = Counter(zip(seq, seq[1:], strict=False))
        best = max(counts.values(), default=0)
        if best < 2:
            return rows
        pair = min((p for p, n in counts.items() if n == best), key=lambda p: (rank[p[0]], rank[p[1]]))
        if not fresh:
            raise ValueError(f"text {text!r} needs more merges than there are unused letters for symbols")
        new = fresh.pop(0)
        rank[new] = 0x110000 + len(rows)  # after every code point, in merge order
        merged, i = [], 0
        while i < len(seq):  # left to right, non-overlapping: "aaab" -> "Zab"
            if tuple(seq[i:i + 2]) == pair:
                merged.append(new)
                i += 2
            else:
                merged.append(seq[i])
                i += 1
        seq = merged
        rows.append(("".join(seq), f"{new} = {pair[0]}{pair[1]}"))


def bpe_merges(text: str = "aaabdaaabac"):
    """The lecture's byte-pair-encoding example: one row per merge, each labelled with its rule.

    The merges are computed, not drawn from a list: for the default text the rows are
    ``aaabdaaabac``, ``ZabdZabac`` (Z = aa), ``ZYdZYac`` (Y = ab), ``XdXac`` (X = ZY). In the
    second step ``Za`` and ``ab`` both occur twice; the tie goes to the pair of lowest ids, as
    ``course_lib.bpe.train`` breaks it (``a b`` are older than ``Z``), which picks ``ab`` as the
    lecture does. ``text``: 1 to 24 printable characters without whitespace.
    """
    if not isinstance(text, str) or not 1 <= len(text) <= 24 or not text.isprintable() \
            or any(c.isspace() for c in text):
        raise ValueError(f"text must be a str of 1 to 24 printable characters without whitespace, "
                         f"got {text!r}")
    rows = _bpe_rows(text)
    pitch = 0.55
    fig, ax = _canvas(height=max(HEIGHT, 1.1 + pitch * len(rows)))
    top = fig.get_figheight() - 0.3
    ax.text(0.2, top, "Byte-pair encoding: replace the most frequent adjacent pair by a new symbol",
            fontsize=TITLE, weight="bold", va="center")
    cell = min(0.36, 4.6 / len(text))
    x0 = 2.2
    colour = {}  # each new symbol keeps its colour in the rows below, so its spread can be followed
    for r, (string, rule) in enumerate(rows):
        y = top - 0.6 - r * pitch
        new = rule[0] if r else None
        if new:
            colour[new] = CYCLE[(r - 1) % len(CYCLE)]
        ax.text(x0 - 0.25, y, rule if r else "start", ha="right", va="center", fontsize=FONT,
                color=INK, family="monospace")
        for j, symbol in enumerate(string):
            c = colour.get(symbol, GREY)
            _box(ax, x0 + (j + 0.5) * cell, y, cell * 0.92, 0.36, symbol, c,
                 fill=_tint(c, 0.45) if symbol in colour else "white",
                 lw=2.2 if symbol == new else 0.8, fontsize=12)
        ax.text(x0 + len(text) * cell + 0.25, y, f"{len(string)} symbols", va="center", fontsize=SMALL,
                color=INK)
    ax.text(x0, top - 0.6 - len(rows) * pitch + 0.1, "no pair occurs twice: stop", fontsize=SMALL,
            style="italic", color=INK, va="center")
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 02
# ---------------------------------------------------------------------------------------------

def attention_masks(S: int = 6, window: int = 3, n_pad: int = 2):
    """Three ``S x S`` masks from ``course_lib.attention.masks``: causal, causal with a sliding
    window of ``window`` keys (the query's own included) and padding (the last ``n_pad`` keys are
    pad tokens; every query, padded ones too, ignores them). Rows are queries, columns keys;
    filled cells may attend, hatched blank cells are masked. ``S`` in 1 .. 16."""
    import matplotlib.pyplot as plt
    import torch
    from matplotlib.patches import Patch

    from .attention import masks

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


# ---------------------------------------------------------------------------------------------
# Chapter 03
# ---------------------------------------------------------------------------------------------

def _params(module) -> str:
    """A module's parameter count, ``66 k params`` style."""
    return f"{_si(sum(p.numel() for p in module.parameters())).rstrip()} params"


def gpt_architecture(config=None):
    """A decoder-only GPT from token ids to logits, drawn for ``config`` (a
    :class:`course_lib.model.ModelConfig`; default: its defaults): the token embedding (plus the
    position table when positions are learned), one pre-norm block standing for all ``L`` (norm,
    causal multi-head attention, +; norm, MLP, +), the final norm and the LM head, with each part's
    parameter count taken from a ``model.GPT(config)`` built on the meta device (shapes, no
    memory). A tied head is drawn as one matrix used twice. Only pre-norm, dense GPTs are drawn."""
    import torch

    from .model import GPT, ModelConfig

    config = ModelConfig() if config is None else config
    if not isinstance(config, ModelConfig):
        raise ValueError(f"config must be a model.ModelConfig or None, got {type(config).__name__}")
    if config.norm_position != "pre" or config.moe is not None:
        raise ValueError("gpt_architecture draws a pre-norm GPT with dense MLPs")
    with torch.device("meta"):
        gpt = GPT(config)
    c, block = config, gpt.blocks[0]
    norm = "RMSNorm" if c.norm == "rmsnorm" else "LayerNorm"
    fig, ax = _canvas()
    ax.text(WIDTH / 2, 3.3, f"GPT: {gpt.num_params():,} parameters  (V = {c.vocab_size}, D = {c.d_model}, "
            f"L = {c.n_layers}, H = {c.n_heads}, Hkv = {c.kv_heads}, F = {c.ff_width}, "
            f"context {c.context_length})", ha="center", va="center", fontsize=FONT, weight="bold")
    y = 1.45  # the residual stream's height
    ax.text(0.05, y, "token\nids\n(B, S)", va="center", fontsize=SMALL)
    _box(ax, 1.1, y, 0.95, 0.85, f"token\nembedding\nV × D\n{_params(gpt.tok_emb)}", GREY, fontsize=SMALL)
    _arrow(ax, (0.5, y), (0.62, y))
    if gpt.pos_emb is not None:
        _box(ax, 1.1, 0.55, 0.95, 0.6, f"positions\n{c.context_length} × D\n{_params(gpt.pos_emb)}", GREY,
             fontsize=SMALL)
        _plus(ax, 1.7, y)
        _arrow(ax, (1.58, 0.55), (1.7, 0.55), (1.7, y - 0.09))
        _arrow(ax, (1.58, y), (1.7 - 0.09, y))
    # one block, standing for L: the stream runs left to right, each sublayer branches above it
    x0, x1 = 1.85, 6.0
    ax.add_patch(_rect(x0, 0.3, x1 - x0, 2.6))
    ax.text((x0 + x1) / 2, 0.48, f"block, repeated L = {c.n_layers} times ({_params(block)} each)",
            ha="center", va="center", fontsize=SMALL, style="italic")
    ax.plot([1.58, x1 + 0.1], [y, y], color=INK, linewidth=2.5, zorder=1)
    rope = "\nRoPE on q and k" if c.positional == "rope" else ""
    # the attention branch returns (its +) left of the MLP's norm, so no line runs into that box
    sublayers = [(x0 + 0.4, ATTENTION, f"causal attention\nH = {c.n_heads}, Hkv = {c.kv_heads}{rope}\n"
                  f"{_params(block.attn)}"),
                 (x0 + 2.4, MLP, f"MLP, {'SwiGLU' if c.mlp == 'swiglu' else 'GELU'}\nD → F → D\n"
                  f"{_params(block.mlp)}")]
    nw, bw = 0.5, 1.2  # widths of a norm box and a sublayer box
    for xr, color, label in sublayers:
        ax.plot([xr], [y], "o", color=INK, markersize=4, zorder=3)  # the read point
        _arrow(ax, (xr, y), (xr, y + 0.47))
        _box(ax, xr, y + 0.65, nw, 0.36, norm.replace("Norm", "\nNorm"), NORM, fontsize=SMALL)
        left = xr + nw / 2 + 0.06  # the sublayer box's left edge
        _arrow(ax, (xr + nw / 2, y + 0.65), (left, y + 0.65))
        _box(ax, left + bw / 2, y + 0.65, bw, 0.85, label, color, fontsize=SMALL)
        back = left + bw + 0.12  # where the branch comes back down into the stream
        _arrow(ax, (left + bw, y + 0.65), (back, y + 0.65), (back, y + 0.09))
        _plus(ax, back, y)
    ax.text(x0 + 0.15, y - 0.25, "residual stream (B, S, D)", fontsize=SMALL, va="center")
    _box(ax, 6.45, y, 0.7, 0.5, f"final\n{norm}", NORM, fontsize=SMALL)
    _box(ax, 7.45, y, 0.8, 0.6, "LM head\nD → V", GREY, fontsize=SMALL)
    _arrow(ax, (6.8, y), (7.05, y))
    _arrow(ax, (7.45, y + 0.3), (7.45, y + 0.8))
    ax.text(7.45, y + 0.88, "logits (B, S, V)\n→ next-token\nprobabilities", ha="center", va="bottom",
            fontsize=SMALL)
    if c.tie_embeddings:  # one matrix, used twice: drawn as a dashed link under the block
        _arrow(ax, (1.1, y - 0.43), (1.1, 0.1), (7.45, 0.1), (7.45, y - 0.3), color=FOCUS, ls="--")
        ax.text(6.62, 0.65, "tied: head and\nembedding share\none matrix", ha="center", va="center",
                fontsize=SMALL)
    else:
        ax.text(7.45, y - 0.4, f"untied\n{_params(gpt.lm_head)}", ha="center", va="top", fontsize=SMALL)
    return fig


def _rect(x, y, w, h):
    """A pale frame around a block."""
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08", facecolor="#FAFAFA",
                          edgecolor=GREY, linewidth=1.0, zorder=0.5)


def transformer_families():
    """The three families side by side, each with its self-attention mask as an icon: encoder-only
    (BERT-like, bidirectional), decoder-only (GPT-like, causal), encoder-decoder (T5, the original
    Transformer: a bidirectional encoder, a causal decoder that cross-attends to it)."""
    fig, ax = _canvas()
    n = 5  # cells per side of a mask icon
    full = [[True] * n for _ in range(n)]
    causal = [[j <= i for j in range(n)] for i in range(n)]

    def icon(x, size, allowed, color, label):
        _cells(ax, allowed, x - size / 2, 1.75, size / n, color)
        ax.text(x, 1.75 - size - 0.12, label, ha="center", va="top", fontsize=SMALL)

    columns = [(1.3, "Encoder-only", "BERT-like"), (3.9, "Decoder-only", "GPT-like"),
               (6.5, "Encoder-decoder", "T5, the original Transformer")]
    for x, name, example in columns:
        ax.text(x, 3.25, name, ha="center", va="center", fontsize=TITLE, weight="bold")
        ax.text(x, 2.97, example, ha="center", va="center", fontsize=FONT, style="italic")
    _box(ax, 1.3, 2.35, 2.1, 0.55, "encoder\nbidirectional self-attention", BLUE)
    icon(1.3, 0.75, full, BLUE, "bidirectional:\nevery token sees every token")
    ax.text(1.3, 0.2, "use: classify, embed", ha="center", va="center", fontsize=SMALL)
    _box(ax, 3.9, 2.35, 2.1, 0.55, "decoder\ncausal self-attention", ORANGE)
    icon(3.9, 0.75, causal, ORANGE, "causal:\ntoken i sees tokens 0 .. i")
    ax.text(3.9, 0.2, "use: generate text", ha="center", va="center", fontsize=SMALL)
    _box(ax, 5.8, 2.35, 1.0, 0.55, "encoder\nbidirectional", BLUE)
    _box(ax, 7.2, 2.35, 1.3, 0.65, "decoder\ncausal self-attn\n+ cross-attention", ORANGE, fontsize=SMALL)
    _arrow(ax, (6.3, 2.35), (6.55, 2.35))
    icon(5.8, 0.6, full, BLUE, "encoder:\nbidirectional")
    icon(7.2, 0.6, causal, ORANGE, "decoder:\ncausal")
    ax.text(6.5, 0.2, "use: translate, summarise", ha="center", va="center", fontsize=SMALL)
    return fig


def residual_stream(n_layers: int = 2):
    """The residual stream as a vertical line from the token and position embeddings up to the
    final norm and the unembedding. Each block's attention and MLP read the stream through a norm
    (pre-norm) and add their output back at a + node: ``x <- x + f(Norm(x))``. ``n_layers`` in
    1 .. 4 (the figure grows taller with it)."""
    _int("n_layers", n_layers, 1, 4)
    band, first = 0.55, 0.8  # height per sublayer; height of the first read point
    top = first + band * 2 * n_layers + 0.25
    fig, ax = _canvas(height=top + 0.3)
    x = 2.5
    ax.plot([x, x], [0.5, top], color=INK, linewidth=2.5, zorder=1)
    ax.text(x - 0.2, (first + top) / 2, "residual stream\nx: (B, S, D)", rotation=90, ha="right",
            va="center", fontsize=SMALL)
    _box(ax, x, 0.35, 2.6, 0.32, "token + position embedding", GREY, fontsize=SMALL)
    ax.text(0.1, 0.35, "token ids\n(B, S)", va="center", fontsize=SMALL)
    _arrow(ax, (0.75, 0.35), (x - 1.3, 0.35))
    for layer in range(n_layers):
        y = first + 2 * layer * band
        for k, (name, color) in enumerate((("attention", ATTENTION), ("MLP", MLP))):
            yk = y + k * band
            _sublayer(ax, x, yk, [(3.25, 0.65, "norm", NORM), (4.5, 1.1, name, color)])
            ax.text(5.35, yk + 0.15, f"x ← x + {name}(norm(x))", va="center", fontsize=SMALL)
        y_end = y + band + 0.3
        ax.plot([1.7, 1.6, 1.6, 1.7], [y - 0.05, y - 0.05, y_end + 0.05, y_end + 0.05], color=INK,
                linewidth=1)
        ax.text(1.5, (y + y_end) / 2, f"block {layer + 1}", ha="right", va="center", fontsize=FONT)
    _box(ax, x, top, 1.0, 0.28, "final norm", NORM, fontsize=SMALL, zorder=2.5)
    _box(ax, 4.3, top, 1.7, 0.28, "unembedding D → V", GREY, fontsize=SMALL)
    _arrow(ax, (x + 0.5, top), (4.3 - 0.85, top))
    _arrow(ax, (5.15, top), (5.5, top))
    ax.text(5.55, top, "logits (B, S, V)", va="center", fontsize=SMALL)
    ax.text(5.35, 0.35, "pre-norm: each sublayer reads\nnorm(x) and adds its output back", va="center",
            fontsize=SMALL, style="italic")
    return fig


# ---------------------------------------------------------------------------------------------
# Chapter 04
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Chapter 05
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Chapter 06
# ---------------------------------------------------------------------------------------------

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

    from .scaling import ChinchillaLaw

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


# ---------------------------------------------------------------------------------------------
# Chapter 07
# ---------------------------------------------------------------------------------------------

def moe_routing(n_tokens: int = 6, E: int = 4, K: int = 1, capacity_factor: float = 1.0, seed: int = 0):
    """Tokens, a router and ``E`` experts with ``ceil(capacity_factor * n_tokens * K / E)`` slots
    each. The router is ``course_lib.moe.routing.route`` on logits drawn from a seeded
    ``torch.Generator`` (so the picture is the same every time); seats go first come, first served,
    first choices before second ones. Each choice is an arrow from its token to its expert; a
    choice that finds its expert full is dashed and labelled "dropped" (the token then passes the
    layer on the residual stream alone). The default seed drops one token.
    ``n_tokens`` in 1 .. 12, ``E`` in 1 .. 8, ``K`` in 1 .. E, ``capacity_factor`` > 0."""
    import torch

    from .moe.routing import expert_capacity, route

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


# ---------------------------------------------------------------------------------------------
# Chapter 08
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# Chapter 09
# ---------------------------------------------------------------------------------------------

def rlhf_pipeline():
    """From a pretrained model to an aligned policy: supervised fine-tuning, then preference
    pairs, a reward model and RL (PPO with a KL penalty to the SFT model as reference); DPO as a
    shortcut from the preference pairs straight to the policy; RL with verifiable rewards (a
    checker instead of a reward model) as a third branch from the SFT model."""
    fig, ax = _canvas()
    y, h, w = 1.75, 0.62, 1.2
    _box(ax, 0.75, 2.95, w, 0.5, "pretrained\nmodel", GREY)
    _box(ax, 0.75, y, w, h, "supervised\nfine-tuning\n(SFT)", BLUE, fontsize=SMALL)
    _arrow(ax, (0.75, 2.7), (0.75, y + h / 2))
    _box(ax, 2.25, y, w, h, "preference\npairs (chosen,\nrejected)", YELLOW, fontsize=SMALL)
    _box(ax, 3.75, y, w, h, "reward\nmodel", BLUE, fontsize=SMALL)
    _box(ax, 5.25, y, w, h, "RL: PPO with\nKL penalty to\nreference (SFT)", BLUE, fontsize=SMALL)
    _box(ax, 7.05, y, 1.3, h, "aligned\npolicy", INK, fill="white", weight="bold")
    for a, b in ((0.75, 2.25), (2.25, 3.75), (3.75, 5.25)):
        _arrow(ax, (a + w / 2, y), (b - w / 2, y), color=BLUE)
    _arrow(ax, (5.25 + w / 2, y), (7.05 - 0.65, y), color=BLUE)
    ax.text(4.5, y - h / 2 - 0.12, "RLHF: reward model + PPO", ha="center", va="top", fontsize=SMALL)
    # DPO: from the pairs straight to the policy, over the top
    _arrow(ax, (2.25, y + h / 2), (2.25, 2.95), (7.05, 2.95), (7.05, y + h / 2), color=VERMILLION, lw=1.6,
           ls="--")
    ax.text(4.65, 3.03, "DPO: learn from the pairs directly (no reward model, no RL)", ha="center",
            va="bottom", fontsize=SMALL)
    # RL with verifiable rewards: from the SFT model, scored by a checker
    _box(ax, 3.75, 0.45, 3.7, 0.5, "RL with verifiable rewards: a checker\n(unit tests, exact answers) "
         "replaces the reward model", GREEN, fontsize=SMALL)
    _arrow(ax, (0.75, y - h / 2), (0.75, 0.45), (3.75 - 1.85, 0.45), color=GREEN, lw=1.6)
    _arrow(ax, (3.75 + 1.85, 0.45), (7.05, 0.45), (7.05, y - h / 2), color=GREEN, lw=1.6)
    return fig
