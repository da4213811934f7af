"""Byte-level BPE tokenization: training, encoding, tiktoken interop (chapter 01).

The package, read in this order:

* ``core``: split patterns, :func:`get_pair_counts`, :func:`merge`, encoding by rank;
* ``pretokenize``: where text can be cut without changing its split (documents at special
  tokens, the certain prefix of a stream, parallel piece counts);
* ``training``: :func:`train`, incremental and heap-based (the naive loop is in its docstring),
  splitting the text at special tokens, with ``num_workers`` processes for the counting;
* ``tokenizer``: :class:`Tokenizer` (encode, ``encode_iterable`` for streams, decode, save,
  load, ``to_tiktoken``);
* ``tiktoken_interop``: OpenAI's r50k/cl100k/o200k ranks offline, :func:`from_tiktoken`.

Left out: HuggingFace-style byte-to-unicode vocab files, normalization, and parallel merging
(only the counting pass over the text runs in several processes; the merge loop is serial).

>>> tok = train("aaabdaaabac", 259, pattern=None)
>>> tok.encode("aaabdaaabac")
[258, 100, 258, 97, 99]
>>> tok.decode([258, 100])
'aaabd'

Command line: ``python -m course_lib.bpe fetch-ranks`` puts the GPT-2 ranks in the cache.
"""

from .core import (
    GPT2_SPLIT_PATTERN,
    GPT4_SPLIT_PATTERN,
    O200K_SPLIT_PATTERN,
    bpe_by_rank,
    get_pair_counts,
    merge,
)
from .pretokenize import certain_prefix, count_pieces, split_at_specials
from .tiktoken_interop import (
    ENCODINGS,
    cache_dir,
    fetch_gpt2_ranks,
    from_tiktoken,
    load_ranks,
    tiktoken_encoding,
)
from .tokenizer import ALL_PATTERN, Tokenizer
from .training import train

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "GPT4_SPLIT_PATTERN",
    "O200K_SPLIT_PATTERN",
    "ALL_PATTERN",
    "ENCODINGS",
    "Tokenizer",
    "bpe_by_rank",
    "cache_dir",
    "certain_prefix",
    "count_pieces",
    "fetch_gpt2_ranks",
    "from_tiktoken",
    "get_pair_counts",
    "load_ranks",
    "merge",
    "split_at_specials",
    "tiktoken_encoding",
    "train",
]
