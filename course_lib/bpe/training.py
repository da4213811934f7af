"""Training a byte-level BPE tokenizer, fast enough for a 5 MB corpus (chapter 01).

The naive algorithm, which the tests use as a reference::

    words = [list(chunk.encode("utf-8")) for doc in split_at_specials(text, specials)
             for chunk in pretokenize(doc)]
    while len(vocab) < vocab_size:
        counts = sum of get_pair_counts(w) over words      # recount everything
        pair = the most frequent pair (ties: see tie_break)
        words = [merge(w, pair, new_id) for w in words]

This version gives the same merges without the recount:

* identical chunks are counted once, with their frequency ("the" appears ~25,000 times in
  Shakespeare but is processed once); counting them is the only pass over the text, and
  ``num_workers`` processes share it (``pretokenize.count_pieces``);
* ``counts`` {pair: weighted count} and ``where`` {pair: set of chunk indices} are kept up
  to date: a merge only touches the chunks that contain the merged pair, subtracting their
  old pairs and adding their new ones;
* the best pair comes from a heap with lazy deletion: each count change pushes a new entry,
  and a popped entry whose count is out of date is dropped.

Worked lecture example (``pattern=None``: the whole string is one chunk)::

    aaabdaaabac   pairs: aa 4 (overlapping), ab 2, ...   merge aa -> Z (256)
    ZabdZabac     Za 2, ab 2 (tie; "lowest" ids: (97, 98) < (256, 97)) -> Y = ab (257)
    ZYdZYac       ZY 2                                    merge ZY -> X (258)
    XdXac         = [258, 100, 258, 97, 99]

With ``tie_break="greatest"`` the tie picks Za (b"aa" > b"a"), then Yb; the encoding of
this string is the same, the merges are not.
"""

from __future__ import annotations

import heapq

from tqdm.auto import tqdm

from .core import GPT4_SPLIT_PATTERN
from .pretokenize import count_pieces
from .tokenizer import Tokenizer

__all__ = ["train"]

_TIE_BREAKS = ("lowest", "greatest")


class _Greatest:
    """Heap key that sorts greater byte-string pairs first (heapq is a min-heap)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[bytes, bytes]):
        self.key = key

    def __lt__(self, other: _Greatest) -> bool:
        return self.key > other.key


def train(
    text: str,
    vocab_size: int,
    *,
    pattern: str | None = GPT4_SPLIT_PATTERN,
    special_tokens: list[str] | dict[str, int] | None = None,
    tie_break: str = "lowest",
    progress: bool = False,
    num_workers: int = 1,
) -> Tokenizer:
    """Train a byte-level BPE tokenizer on ``text``. Chapter 01.

    ``vocab_size`` counts the 256 bytes, the merges and the special tokens. Training stops
    early when no adjacent pair is left (every chunk is a single token); pairs seen once
    are still merged. ``pattern`` splits the text into chunks that merges never cross
    (None: the whole text is one chunk, as in the lecture example; then every merge
    rewrites that one chunk, so keep such texts short).

    ``special_tokens``: a list gets the ids after the last merge, in order; a dict gives
    explicit ids. The text is first split at every occurrence of any of them (documents
    joined by ``"<|endoftext|>"``): the special tokens are never counted or merged, and no
    chunk, so no merge, crosses one. Training on ``"a<|endoftext|>b"`` counts the chunks
    of "a" and of "b", as if each had been read alone.

    ``num_workers``: processes that split and count the chunks (the one pass over the
    text); the merges are the same for every value. Workers are started with "spawn", so
    a script that calls this with ``num_workers > 1`` needs the usual
    ``if __name__ == "__main__":`` guard on macOS and Windows.

    ``tie_break`` for pairs with equal counts: "lowest" picks the smallest (id0, id1);
    "greatest" picks the greatest (vocab[id0], vocab[id1]) pair of byte strings.

    If a merge produces bytes that already have an id (the same bytes reached by two
    different splits, e.g. (a, bc) after (ab, c)), the pair is merged into that existing
    id: ids stay unique per byte string, so the ranks (and tiktoken export) are exact.
    ``len(merges)`` can then exceed the number of new ids.

    >>> tok = train("aaabdaaabac", 259, pattern=None)
    >>> tok.merges
    {(97, 97): 256, (97, 98): 257, (256, 257): 258}
    >>> tok.encode("aaabdaaabac")
    [258, 100, 258, 97, 99]
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if tie_break not in _TIE_BREAKS:
        raise ValueError(f"tie_break must be one of {_TIE_BREAKS}, got {tie_break!r}")
    if isinstance(special_tokens, str):
        raise ValueError(f"special_tokens must be a list or dict of str, got {special_tokens!r}")
    for name in special_tokens or []:
        if not isinstance(name, str) or not name:
            raise ValueError(f"special tokens must be non-empty str, got {name!r}")
    if isinstance(special_tokens, dict):
        specials = dict(special_tokens)
    else:
        specials = {s: None for s in special_tokens or []}  # ids assigned at the end
        if len(specials) != len(special_tokens or []):
            raise ValueError(f"special_tokens has duplicates: {special_tokens}")
    minimum = 256 + len(specials)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < minimum:
        raise ValueError(
            f"vocab_size must be an int >= {minimum} (256 bytes + {len(specials)} special "
            f"tokens), got {vocab_size!r}"
        )

    n_target = vocab_size - len(specials)  # bytes + merges
    for name, idx in specials.items():
        if idx is not None and (
            isinstance(idx, bool) or not isinstance(idx, int) or idx < n_target
        ):
            raise ValueError(
                f"special token {name!r} has id {idx!r}; explicit ids must be ints >= "
                f"{n_target}, after the {n_target} byte and merge ids"
            )

    # 1. distinct chunks of the documents with their frequencies, as lists of byte ids
    chunk_freq = count_pieces(
        text, pattern, specials, num_workers=num_workers, progress=progress
    )
    words = [list(c.encode("utf-8", "surrogatepass")) for c in chunk_freq]
    freqs = list(chunk_freq.values())
    del chunk_freq

    # 2. weighted pair counts and where each pair occurs
    counts: dict[tuple[int, int], int] = {}
    where: dict[tuple[int, int], set[int]] = {}
    for w, (word, freq) in enumerate(zip(words, freqs, strict=True)):
        for pair in zip(word, word[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + freq
            where.setdefault(pair, set()).add(w)

    vocab = {i: bytes([i]) for i in range(256)}
    ranks = {b: i for i, b in vocab.items()}
    greatest = tie_break == "greatest"

    def entry(pair, count):
        if greatest:
            return (-count, _Greatest((vocab[pair[0]], vocab[pair[1]])), pair)
        return (-count, pair, pair)

    heap = [entry(p, c) for p, c in counts.items()]
    heapq.heapify(heap)

    # 3. merge until the vocabulary is full or no pair is left
    merges: dict[tuple[int, int], int] = {}
    bar = tqdm(total=n_target - 256, desc="BPE merges", disable=not progress)
    while len(vocab) < n_target and heap:
        neg_count, _, pair = heapq.heappop(heap)
        if counts.get(pair) != -neg_count:
            continue  # stale heap entry
        new_bytes = vocab[pair[0]] + vocab[pair[1]]
        new_id = ranks.get(new_bytes)
        if new_id is None:  # the usual case: a new token
            new_id = len(vocab)
            vocab[new_id], ranks[new_bytes] = new_bytes, new_id
            bar.update(1)
        merges[pair] = new_id
        changed = set()
        first, second = pair
        for w in where.pop(pair):
            word = words[w]
            # merge in place of the naive merge(word, pair, new_id); skip stale chunks
            new_word, i, n = [], 0, len(word)
            while i < n:
                if word[i] == first and i + 1 < n and word[i + 1] == second:
                    new_word.append(new_id)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            if len(new_word) == n:
                continue  # the pair left this chunk in an earlier merge
            freq = freqs[w]
            for p in zip(word, word[1:], strict=False):
                counts[p] -= freq
                changed.add(p)
            for p in zip(new_word, new_word[1:], strict=False):
                counts[p] = counts.get(p, 0) + freq
                changed.add(p)
                if p not in where:
                    where[p] = {w}
                else:
                    where[p].add(w)
            words[w] = new_word
        counts.pop(pair, None)
        changed.discard(pair)
        for p in changed:
            c = counts[p]
            if c > 0:
                heapq.heappush(heap, entry(p, c))
            else:
                del counts[p]
                where.pop(p, None)
    bar.close()

    next_id = len(vocab)
    for name in specials:
        if specials[name] is None:
            specials[name] = next_id
            next_id += 1
    return Tokenizer(merges, pattern=pattern, special_tokens=specials)
