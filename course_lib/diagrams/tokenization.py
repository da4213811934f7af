"""Chapter 01's diagrams: :func:`bpe_merges`."""

from __future__ import annotations

from collections import Counter

from ._kit import (
    CYCLE,
    FONT,
    GREY,
    HEIGHT,
    INK,
    SMALL,
    TITLE,
    _box,
    _canvas,
    _tint,
)


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
