"""The building blocks of byte-level BPE: split patterns, pair counts, merges (chapter 01).

Byte-pair encoding (Sennrich et al., 2016; byte-level as in GPT-2, Radford et al., 2019)
starts from the 256 byte values and repeatedly replaces the most frequent adjacent pair of
tokens by a new token. Two small functions carry the whole idea:

>>> get_pair_counts([1, 2, 3, 1, 2])
{(1, 2): 2, (2, 3): 1, (3, 1): 1}
>>> merge([1, 2, 3, 1, 2], (1, 2), 4)
[4, 3, 4]

Pairs are counted overlapping (``[97, 97, 97]`` has the pair (97, 97) twice) but merged
left to right without overlap (``merge([97, 97, 97], (97, 97), 256) == [256, 97]``), as
in minbpe.

Encoding a new piece of text does not replay merges; like tiktoken it merges *by rank*:
start from single bytes and repeatedly join the adjacent pair whose concatenated bytes have
the lowest rank (id) in the vocabulary, leftmost first on ties, until no adjacent
concatenation is a token (:func:`bpe_by_rank`).

The split patterns are tiktoken's own strings (``tiktoken_ext/openai_public.py``), so that
pre-tokenization matches tiktoken exactly; they need the ``regex`` module (``\\p{L}``,
possessive quantifiers).
"""

from __future__ import annotations

import heapq

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "O200K_SPLIT_PATTERN",
    "get_pair_counts",
    "merge",
    "bpe_by_rank",
]

# r50k_base (GPT-2). The original GPT-2 release has the equivalent but slower
# r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
# cl100k_base (GPT-4): case-insensitive contractions, digits in groups of at most 3,
# newlines kept apart from other whitespace.
GPT4_SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
    r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# o200k_base (GPT-4o): words split at case changes, contractions attached to words.
O200K_SPLIT_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",  # noqa: E501
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)


def get_pair_counts(
    ids: list[int], counts: dict[tuple[int, int], int] | None = None
) -> dict[tuple[int, int], int]:
    """Count adjacent pairs, overlapping; update ``counts`` in place if given. Chapter 01.

    >>> get_pair_counts([97, 97, 97])
    {(97, 97): 2}
    >>> c = get_pair_counts([1, 2]); get_pair_counts([1, 2, 3], c)
    {(1, 2): 2, (2, 3): 1}
    """
    counts = {} if counts is None else counts
    for pair in zip(ids, ids[1:], strict=False):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """Replace each occurrence of ``pair`` by ``new_id``, left to right, without overlap.

    Returns a new list; ``ids`` is unchanged. Chapter 01.

    >>> merge([97, 97, 97], (97, 97), 256)
    [256, 97]
    >>> merge([1, 2, 1, 2, 2], (1, 2), 9)
    [9, 9, 2]
    """
    first, second = pair
    out = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == first and i + 1 < n and ids[i + 1] == second:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# Pieces longer than this use the heap version (O(n log n)); shorter ones the plain scan,
# which is faster in Python for the short pieces a split pattern produces.
_LONG_PIECE = 64


def bpe_by_rank(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Encode one pre-tokenized piece by merge rank, exactly as tiktoken does.

    Start from single bytes; repeatedly join the adjacent pair whose concatenation has the
    lowest rank in ``ranks`` (leftmost on ties) until no concatenation is a token. Every
    single byte must be in ``ranks``. Naive equivalent (what this does for short pieces)::

        parts = [bytes([b]) for b in piece]
        while True:
            pairs = enumerate(zip(parts, parts[1:]))
            found = [(ranks[a + b], i) for i, (a, b) in pairs if a + b in ranks]
            if not found: break
            _, i = min(found)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return [ranks[p] for p in parts]

    >>> ranks = {bytes([b]): b for b in range(256)} | {b"aa": 256, b"ab": 257, b"aaab": 258}
    >>> bpe_by_rank(b"aaabdaaabac", ranks)
    [258, 100, 258, 97, 99]
    """
    if len(piece) > _LONG_PIECE:
        return _bpe_by_rank_heap(piece, ranks)
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return [ranks[p] for p in parts]


def _bpe_by_rank_heap(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Same result as the scan in :func:`bpe_by_rank`, in O(n log n) for long pieces.

    Parts are byte ranges [start, end) in a linked list; the heap holds candidate joins
    (rank, left start, right start, right end), stale ones skipped when popped.
    """
    n = len(piece)
    end = list(range(1, n + 1))  # end[s]: end of the part starting at s (if alive)
    nxt = list(range(1, n + 1))  # start of the next part (n: none)
    prv = list(range(-1, n - 1))  # start of the previous part (-1: none)
    alive = [True] * n
    heap = []
    for s in range(n - 1):
        rank = ranks.get(piece[s : s + 2])
        if rank is not None:
            heap.append((rank, s, s + 1, s + 2))
    heapq.heapify(heap)
    while heap:
        _, s, r, r_end = heapq.heappop(heap)
        if not alive[s] or nxt[s] != r or not alive[r] or end[r] != r_end:
            continue  # stale: one of the two parts has changed since this was pushed
        end[s], nxt[s] = r_end, nxt[r]  # join the right part into the left one
        alive[r] = False
        if nxt[s] < n:
            prv[nxt[s]] = s
        for left, right in ((prv[s], s), (s, nxt[s])):
            if left >= 0 and right < n:
                rank = ranks.get(piece[left : end[right]])
                if rank is not None:
                    heapq.heappush(heap, (rank, left, right, end[right]))
    out, s = [], 0
    while s < n:
        out.append(ranks[piece[s : end[s]]])
        s = nxt[s]
    return out
