r"""Where text may be cut without changing its pre-tokenization: streaming and parallel counts.

Chapter 01 at scale. Two jobs need a long text cut into parts whose pieces, pre-tokenized
one part at a time, are exactly the pieces of the whole text:

* ``Tokenizer.encode_iterable`` reads a file chunk by chunk and may only emit the ids of
  text whose split can no longer change (:func:`certain_prefix`);
* ``train(..., num_workers=N)`` hands parts of the corpus to N processes, each returning a
  ``Counter`` of pieces (:func:`count_pieces`).

Special tokens always cut: training and encoding split the text at them first, so no piece
and no merge crosses a document boundary::

    "to be<|endoftext|>or not"  ->  "to be" | <|endoftext|> | "or not"

Streaming, inside a document: the split regex is scanned left to right, each match starting
where the last one ended, and it looks only a few characters past a match (``(?!\S)``, the
``'ll`` of a contraction, the end of a run) except through a run of whitespace, which
``\s*[\r\n]``, ``\s+(?!\S)`` and ``\s++$`` read to its end. So the pieces of a buffer
that end by ``u``, ``_MARGIN`` characters before its end (moved back to the start of a
whitespace run that ``u`` falls in), are the pieces of any longer text starting with it::

    buffer:  "Now is the winter of our discontent made glorious summer,\n   "    (61 chars)
                                          u = 61 - 16 = 45 ^
    certain: "Now" " is" " the" " winter" " of" " our" " discontent" " made"    (ids out)
    held:    " glorious summer,\n   "                     (scanned again with the next block)

This assumes a pattern with no lookbehind that looks at most ``_MARGIN`` characters past a
match outside whitespace runs: true of GPT-2's, GPT-4's and GPT-4o's patterns (the tests
check all three on every cut of tricky texts). With ``pattern=None`` (or a pattern such as
``ALL_PATTERN``) a document is one piece, so nothing is certain before its end.

Parallel counts, inside a document: for the three OpenAI patterns, a letter followed by a
space always ends a piece (after a letter these patterns can only take more letters, marks
or an apostrophe; none of them takes a space or tests for the end of the text), and the
part that ends with that letter splits the same alone. So a long document is cut after a
letter followed by a space. Any other pattern is cut at special tokens only.
"""

from __future__ import annotations

import multiprocessing
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import regex
from tqdm.auto import tqdm

from .core import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, O200K_SPLIT_PATTERN

__all__ = ["special_splitter", "split_at_specials", "certain_prefix", "count_pieces"]

# How far past a match the split patterns may look, outside whitespace runs (they need 3:
# "'ll"); generous, since holding back a few more characters costs nothing.
_MARGIN = 16
# Patterns for which "letter, then a space" is always a piece boundary (see above).
_CUT_AFTER_LETTER = frozenset({GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, O200K_SPLIT_PATTERN})
_LETTER_BEFORE_SPACE = regex.compile(r"\p{L}(?= )")
# Characters per task sent to a worker (and per step of the serial count, which bounds the
# memory of its piece lists).
_MIN_TASK, _MAX_TASK = 1 << 16, 1 << 22


def special_splitter(names: Iterable[str]) -> regex.Pattern | None:
    """A regex matching any of ``names``, longest first where one is a prefix of another.

    None when ``names`` is empty. Chapter 01.

    >>> special_splitter(["<|a|>", "<|a|>b"]).findall("x<|a|>b<|a|>")
    ['<|a|>b', '<|a|>']
    """
    names = sorted(names, key=len, reverse=True)
    if not names:
        return None
    return regex.compile("|".join(regex.escape(s) for s in names))


def split_at_specials(text: str, special_tokens: Iterable[str]) -> list[str]:
    """The documents of ``text``: the non-empty parts between special tokens, which are dropped.

    Chapter 01.

    >>> split_at_specials("a<|endoftext|>b c<|endoftext|>", ["<|endoftext|>"])
    ['a', 'b c']
    """
    return [text[a:b] for a, b in _document_spans(text, special_splitter(special_tokens))]


def _document_spans(text: str, splitter: regex.Pattern | None) -> Iterator[tuple[int, int]]:
    start = 0
    if splitter is not None:
        for m in splitter.finditer(text):
            if m.start() > start:
                yield start, m.start()
            start = m.end()
    if len(text) > start:
        yield start, len(text)


def certain_prefix(text: str, split: regex.Pattern | None) -> tuple[list[str], int]:
    """The pieces of ``text`` that no continuation of it can change, and where they end.

    ``split`` is a compiled split pattern (None: the text is one piece, never certain).
    ``text`` must start at a piece boundary and contain no special token. Naive
    equivalent: the longest run of leading pieces of ``text`` that are also the leading
    pieces of ``text + s`` for every string ``s``. Chapter 01.

    >>> pieces, end = certain_prefix("Hello world, this is a stream that goes on  ",
    ...                               regex.compile(GPT4_SPLIT_PATTERN))
    >>> pieces, end
    (['Hello', ' world', ',', ' this', ' is', ' a'], 22)
    """
    if split is None:
        return [], 0
    u = len(text) - _MARGIN
    while u > 0 and text[u - 1].isspace():  # isspace() is a superset of regex's \s
        u -= 1  # never cut inside a whitespace run: its split depends on what ends it
    if u <= 0:
        return [], 0
    pieces = split.findall(text)
    end, n = len(text), len(pieces)
    if sum(map(len, pieces)) != end:  # a pattern that skips characters: use positions
        ends = [m.end() for m in split.finditer(text)]
        n = sum(1 for e in ends if e <= u)
        return pieces[:n], ends[n - 1] if n else 0
    while n and end > u:
        n -= 1
        end -= len(pieces[n])
    return pieces[:n], end


# ---------------------------------------------------------------------- parallel counts
def _cut_document(text: str, start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """Spans of about ``size`` characters, each ending after a letter followed by a space."""
    while stop - start > size:
        m = _LETTER_BEFORE_SPACE.search(text, start + size, stop)
        if m is None:
            break
        yield start, m.end()
        start = m.end()
    yield start, stop


def _tasks(text, pattern, special_tokens, size) -> Iterator[list[str]]:
    """Lists of documents (or parts of documents) of about ``size`` characters in all."""
    batch, n = [], 0
    for a, b in _document_spans(text, special_splitter(special_tokens)):
        spans = _cut_document(text, a, b, size) if pattern in _CUT_AFTER_LETTER else [(a, b)]
        for start, stop in spans:
            batch.append(text[start:stop])
            n += stop - start
            if n >= size:
                yield batch
                batch, n = [], 0
    if batch:
        yield batch


def _count_task(task: tuple[str | None, list[str]]) -> tuple[int, Counter]:
    """Worker (top level, so that "spawn" can import it): (characters read, piece counts)."""
    pattern, parts = task
    split = regex.compile(pattern) if pattern is not None else None
    counts = Counter()
    for part in parts:
        counts.update(split.findall(part) if split is not None else [part])
    return sum(map(len, parts)), counts


def count_pieces(
    text: str,
    pattern: str | None,
    special_tokens: Iterable[str] = (),
    *,
    num_workers: int = 1,
    progress: bool = False,
) -> Counter:
    """{piece: count} of ``text`` split at special tokens (not counted), then by ``pattern``.

    ``num_workers`` > 1 counts parts of the text in that many processes ("spawn"); the
    result is the same. Chapter 01. Naive equivalent::

        Counter(p for doc in split_at_specials(text, special_tokens)
                  for p in (regex.findall(pattern, doc) if pattern else [doc]))

    >>> count_pieces("to be<|endoftext|> to be", r" ?\\w+", ["<|endoftext|>"])
    Counter({' be': 2, 'to': 1, ' to': 1})
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    size = min(_MAX_TASK, max(_MIN_TASK, -(-len(text) // (4 * num_workers))))
    tasks = ((pattern, batch) for batch in _tasks(text, pattern, list(special_tokens), size))
    results = map(_count_task, tasks) if num_workers == 1 else _in_processes(tasks, num_workers)
    total = Counter()
    with tqdm(total=len(text), desc="BPE pre-tokenize", unit="char", disable=not progress) as bar:
        for n, counts in results:
            total.update(counts)
            bar.update(n)
    return total


def _in_processes(tasks, num_workers: int) -> Iterator[tuple[int, Counter]]:
    """``_count_task`` of each task in ``num_workers`` processes, results in task order.

    At most two tasks per worker are in flight, so the parent never holds a copy of the
    whole text. A pool broken at start (spawn re-runs the caller's script: without a
    ``__main__`` guard the workers die) raises instead of waiting forever.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(num_workers, mp_context=context) as pool:
        in_flight = deque()
        try:
            for task in tasks:
                in_flight.append(pool.submit(_count_task, task))
                if len(in_flight) >= 2 * num_workers:
                    yield in_flight.popleft().result()
            while in_flight:
                yield in_flight.popleft().result()
        except BrokenProcessPool as e:
            raise RuntimeError(
                "a worker process of train(num_workers=...) died; in a script, call it "
                'under `if __name__ == "__main__":` (workers are started with "spawn")'
            ) from e
