"""The drawing kit of the course's diagrams: the palette, sizes, and the shared pieces (a canvas in
inches, a labelled box, an arrow along points, a + node, mask cells, a matrix to scale, a sublayer
beside a residual stream, argument checks). Each chapter's module draws with these."""

from __future__ import annotations

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
