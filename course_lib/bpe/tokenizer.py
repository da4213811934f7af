"""A byte-level BPE tokenizer: encode, decode, save, load, export to tiktoken (chapter 01).

A :class:`Tokenizer` is a vocabulary of byte strings with ids, a split pattern and special
tokens. Ids 0..255 are the single bytes (for trained tokenizers; tiktoken's vocabularies
order the bytes differently, see :meth:`Tokenizer.from_ranks`), and each merge
``(id0, id1) -> id`` adds ``vocab[id] = vocab[id0] + vocab[id1]``.

Encoding text::

    "Hello world<|endoftext|>"
      | split on allowed special tokens      -> "Hello world", "<|endoftext|>"
      | pre-tokenize with the split pattern  -> "Hello", " world"
      | UTF-8 bytes of each piece            -> b"Hello", b" world"
      | merge by rank, as tiktoken does      -> [id("Hello")], [id(" world")]
      v
    [..., ..., 100257]

A file too big for memory is encoded with :meth:`Tokenizer.encode_iterable`, which reads it
chunk by chunk and yields the same ids as ``encode`` of the whole text (where it may cut
is explained in ``pretokenize``).

Encoding is by rank, not by replaying merges (see ``core.bpe_by_rank``), so our ids are
tiktoken's ids for the same ranks; the tests check this against tiktoken itself.

Unicode corner: text is turned into bytes with ``str.encode("utf-8", "surrogatepass")``,
so a lone surrogate such as ``"\\ud800"`` becomes the 3 bytes ED A0 80 and comes back on
decode: ``decode(encode(s)) == s`` for every Python str. tiktoken instead replaces lone
surrogates with U+FFFD before encoding, so on such text (only) the two differ.

>>> tok = Tokenizer({(97, 97): 256, (256, 97): 257}, pattern=None)
>>> tok.encode("aaab")
[257, 98]
>>> tok.decode([257, 98])
'aaab'
"""

from __future__ import annotations

import codecs
import itertools
import json
import operator
import os
from collections.abc import Iterable, Iterator

import regex

from .core import GPT4_SPLIT_PATTERN, bpe_by_rank
from .pretokenize import certain_prefix, special_splitter

__all__ = ["Tokenizer", "ALL_PATTERN"]

FORMAT_VERSION = 1
# encode_iterable gathers chunks into blocks of at least this many characters
_STREAM_BLOCK = 1 << 16
# most pieces whose ids encode remembers (~50 MB; 60 MB of text has ~230,000 distinct)
_CACHE_SIZE = 1 << 18
# tiktoken needs a split pattern; with pattern=None the whole text is one piece.
ALL_PATTERN = r"[\s\S]+"


def _replace_keep_surrogates(exc: UnicodeError):
    """UTF-8 error handler: bytes that encode a surrogate come back as the surrogate
    (like 'surrogatepass'), any other invalid bytes become U+FFFD (like 'replace')."""
    try:
        return codecs.lookup_error("surrogatepass")(exc)
    except UnicodeError:
        return codecs.lookup_error("replace")(exc)


# A named error handler lets bytes.decode stay linear-time; registering is idempotent.
_DECODE_HANDLER = "course_lib.bpe.replace"
codecs.register_error(_DECODE_HANDLER, _replace_keep_surrogates)


class Tokenizer:
    """Byte-level BPE tokenizer with tiktoken-compatible encoding. Taught in chapter 01.

    Attributes: ``pattern`` (split regex, or None for "whole text is one piece"),
    ``merges`` ({(id0, id1): id}, in merge order), ``vocab`` ({id: bytes}, without special
    tokens), ``special_tokens`` ({str: id}), ``ranks`` ({bytes: id}, the inverse of vocab).
    Build one with :func:`course_lib.bpe.train`, from merges, or from tiktoken-style ranks.
    """

    def __init__(
        self,
        merges: dict[tuple[int, int], int],
        pattern: str | None = GPT4_SPLIT_PATTERN,
        special_tokens: dict[str, int] | None = None,
    ):
        vocab = {i: bytes([i]) for i in range(256)}
        for (a, b), idx in merges.items():
            if a not in vocab or b not in vocab:
                missing = a if a not in vocab else b
                raise ValueError(f"merge ({a}, {b}) -> {idx} uses unknown id {missing}")
            new = vocab[a] + vocab[b]
            if idx in vocab and vocab[idx] != new:
                raise ValueError(
                    f"merge ({a}, {b}) -> {idx}: id {idx} is already {vocab[idx]!r}, not {new!r}"
                )
            vocab[idx] = new
        self._setup(vocab, pattern, special_tokens)
        self._merges = dict(merges)

    @classmethod
    def from_ranks(
        cls,
        ranks: dict[bytes, int],
        pattern: str | None,
        special_tokens: dict[str, int] | None = None,
    ) -> Tokenizer:
        """A tokenizer from tiktoken-style ranks {token bytes: id}; all 256 bytes needed.

        Encoding only needs the ranks. ``merges`` is recovered on first use, minbpe-style:
        a token's pair is the two parts that encoding its bytes with the lower-ranked
        tokens alone ends in; tokens that do not end in exactly two parts have no merge.
        """
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise ValueError(
                f"ranks must contain all 256 single bytes; byte {missing[0]} is missing"
            )
        tok = cls.__new__(cls)
        tok._setup({idx: tok_bytes for tok_bytes, idx in ranks.items()}, pattern, special_tokens)
        tok._merges = None
        return tok

    def _setup(self, vocab, pattern, special_tokens) -> None:
        if pattern is not None and not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str or None, got {type(pattern).__name__}")
        self.pattern = pattern
        self.vocab: dict[int, bytes] = vocab
        self.ranks: dict[bytes, int] = {b: i for i, b in vocab.items()}
        if len(self.ranks) != len(vocab):
            raise ValueError("vocab has two ids for the same bytes; ids must be unique")
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        for name, idx in self.special_tokens.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"special tokens must be non-empty str, got {name!r}")
            if idx in vocab:
                raise ValueError(f"special token {name!r} has id {idx}, already a vocab id")
        if len(set(self.special_tokens.values())) != len(self.special_tokens):
            raise ValueError(f"special tokens share an id: {self.special_tokens}")
        self._decoder = dict(vocab) | {i: s.encode("utf-8") for s, i in self.special_tokens.items()}
        self._split = regex.compile(pattern) if pattern is not None else None
        self._cache: dict[str, list[int]] = {}

    @property
    def merges(self) -> dict[tuple[int, int], int]:
        if self._merges is None:  # from_ranks: recover the merges once, lazily
            self._merges = {}
            for tok_bytes, idx in sorted(self.ranks.items(), key=lambda kv: kv[1]):
                if len(tok_bytes) < 2:
                    continue
                lower = _RankLimit(self.ranks, idx)
                parts = bpe_by_rank(tok_bytes, lower)
                if len(parts) == 2:
                    self._merges[(parts[0], parts[1])] = idx
        return self._merges

    @property
    def vocab_size(self) -> int:
        """Number of ids: vocabulary plus special tokens."""
        return len(self.vocab) + len(self.special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        pattern = "None" if self.pattern is None else f"{self.pattern[:30]!r}..."
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, pattern={pattern}, "
            f"special_tokens={self.special_tokens})"
        )

    # ------------------------------------------------------------------ encode
    def encode_ordinary(self, text: str) -> list[int]:
        """Encode ``text`` ignoring special tokens (their strings are plain text here)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        pieces = self._split.findall(text) if self._split is not None else [text] if text else []
        return self._encode_pieces(pieces)

    def _encode_pieces(self, pieces: list[str]) -> list[int]:
        cache, ranks, out = self._cache, self.ranks, []
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                data = piece.encode("utf-8", "surrogatepass")
                # tiktoken's shortcut: a piece that is a whole token is that token
                idx = ranks.get(data)
                ids = [idx] if idx is not None else bpe_by_rank(data, ranks)
                # keep huge pieces out, and stop growing: memory stays bounded on any stream
                if len(piece) <= 256 and len(cache) < _CACHE_SIZE:
                    cache[piece] = ids
            out.extend(ids)
        return out

    def _allowed(self, allowed_special: str | set[str]) -> set[str]:
        if allowed_special == "all":
            return set(self.special_tokens)
        if allowed_special == "none":
            return set()
        if isinstance(allowed_special, (set, frozenset)):
            unknown = set(allowed_special) - set(self.special_tokens)
            if unknown:
                raise ValueError(f"allowed_special names unknown special tokens: {sorted(unknown)}")
            return set(allowed_special)
        raise ValueError(
            f'allowed_special must be "all", "none" or a set of str, got {allowed_special!r}'
        )

    def _check_disallowed(self, text: str, allowed: set[str]) -> None:
        for name in self.special_tokens:
            if name not in allowed and name in text:
                raise ValueError(
                    f"text contains the special token {name!r}; pass allowed_special="
                    f"{{{name!r}}} or 'all' to encode it as a special token, or use "
                    "encode_ordinary to encode it as plain text"
                )

    def encode(self, text: str, allowed_special: str | set[str] = "none") -> list[int]:
        """Encode ``text`` to ids. Chapter 01.

        ``allowed_special``: "none" (default), "all", or a set of special-token strings.
        Allowed special tokens are emitted as their ids; any other special token found in
        the text raises ValueError (as tiktoken does), because text that merely contains
        "<|endoftext|>" should not silently end a document.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        allowed = self._allowed(allowed_special)
        self._check_disallowed(text, allowed)
        splitter = special_splitter(allowed)
        if splitter is None:
            return self.encode_ordinary(text)
        out, start = [], 0
        for m in splitter.finditer(text):
            out.extend(self.encode_ordinary(text[start : m.start()]))
            out.append(self.special_tokens[m.group()])
            start = m.end()
        out.extend(self.encode_ordinary(text[start:]))
        return out

    def encode_iterable(
        self, chunks: Iterable[str], allowed_special: str | set[str] = "none"
    ) -> Iterator[int]:
        """An iterator over the ids of ``encode("".join(chunks), allowed_special)``, read
        lazily from ``chunks`` in bounded memory. Chapter 01.

        ``chunks``: any iterable of str, cut anywhere (an open text file gives lines; open
        it with ``newline=""`` to keep ``\\r\\n``, which the split patterns treat apart).
        ``allowed_special`` means what it does in :meth:`encode` ("none" by default: a
        stream of documents joined by "<|endoftext|>" wants "all" or that token); a special
        token that is not allowed raises ValueError when the stream reaches it, after the
        ids of the text before it have been yielded.

        Chunks are gathered into blocks of at least 64K characters; from each block only the
        ids of text whose split can no longer change are yielded (up to the last special
        token that no further text can lengthen, then the pieces of
        ``pretokenize.certain_prefix``), and the rest is held for the next block. Memory:
        the held text, a block and one chunk. The held text is a few pieces, unless the text
        has no split points: with ``pattern=None`` a whole document (the text between
        special tokens) is held.

        >>> tok = Tokenizer({(97, 97): 256}, special_tokens={"<|endoftext|>": 257})
        >>> list(tok.encode_iterable(["aa a", "a<|endof", "text|>a"], allowed_special="all"))
        [256, 32, 256, 257, 97]
        >>> tok.encode("aa aa<|endoftext|>a", allowed_special="all")
        [256, 32, 256, 257, 97]
        """
        allowed = self._allowed(allowed_special)
        if not isinstance(chunks, Iterable):
            raise TypeError(f"chunks must be an iterable of str, got {type(chunks).__name__}")
        # lazy, so the checks above run now; chain yields the ids of each block at C speed
        return itertools.chain.from_iterable(self._stream_blocks(chunks, allowed))

    def _stream_blocks(self, chunks: Iterable[str], allowed: set[str]) -> Iterator[list[int]]:
        splitter = special_splitter(allowed)
        # a special token cut by a block boundary (or a longer one it begins) is held whole
        keep = max(map(len, self.special_tokens), default=1) - 1
        held, pending, n_pending = "", [], 0
        block = _STREAM_BLOCK
        for chunk in chunks:
            if not isinstance(chunk, str):
                raise TypeError(f"chunks must be str, got {type(chunk).__name__}")
            pending.append(chunk)
            n_pending += len(chunk)
            if n_pending >= block:
                text = held + "".join(pending)
                pending, n_pending = [], 0
                ids, done = self._encode_certain(text, splitter, allowed, keep)
                held = text[done:]
                # the held text is scanned again with the next block: a block at least as
                # long keeps the total work linear when much is held (pattern=None)
                block = max(_STREAM_BLOCK, len(held))
                yield ids
        text = held + "".join(pending)
        yield self._encode_certain(text, splitter, allowed, keep=None)[0]

    def _encode_certain(self, text, splitter, allowed, keep) -> tuple[list[int], int]:
        """Ids of the part of ``text`` that more text cannot change, and its length.

        ``keep=None``: ``text`` is the end of the stream, all of it is encoded.
        """
        self._check_disallowed(text, allowed)
        # A special token starting before `limit` is certain: nothing longer can start at
        # or before it using characters we have not seen yet.
        limit = len(text) if keep is None else len(text) - keep
        out, start = [], 0
        if splitter is not None:
            for m in splitter.finditer(text):
                if m.start() >= limit:
                    break
                out.extend(self.encode_ordinary(text[start : m.start()]))
                out.append(self.special_tokens[m.group()])
                start = m.end()
        if keep is None:
            out.extend(self.encode_ordinary(text[start:]))
            return out, len(text)
        pieces, n = certain_prefix(text[start : max(start, limit)], self._split)
        out.extend(self._encode_pieces(pieces))
        return out, start + n

    # ------------------------------------------------------------------ decode
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ``ids`` joined; special tokens give their UTF-8 string."""
        ids = list(ids)
        decoder = self._decoder
        try:
            return b"".join([decoder[i] for i in ids])
        except (KeyError, TypeError):
            pass  # slow path, only to name the bad id
        parts = []
        for i in ids:
            try:
                i = operator.index(i)  # ints, numpy ints, 0-d integer tensors
            except TypeError:
                raise TypeError(f"token ids must be ints, got {i!r}") from None
            if i not in decoder:
                raise ValueError(f"unknown token id {i} (vocab_size={self.vocab_size})")
            parts.append(decoder[i])
        return b"".join(parts)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Decode ids to text. Chapter 01.

        ``errors="replace"`` (default): invalid UTF-8 (a token sequence cut mid-character)
        becomes U+FFFD, except the 3-byte encodings of surrogates, which ``encode`` writes
        for lone surrogates and which come back as themselves, so
        ``decode(encode(s)) == s`` for every str. Any other value goes to ``bytes.decode``.
        """
        data = self.decode_bytes(list(ids))
        return data.decode("utf-8", _DECODE_HANDLER if errors == "replace" else errors)

    # --------------------------------------------------------------- save/load
    def save(self, path: str | os.PathLike) -> None:
        """Write one readable JSON file: version, pattern, merges [id0, id1, id], specials.

        Each merge is written with its id because two merges can share one id (see
        ``train``). Tokenizers from ``from_ranks`` whose bytes are not ids 0..255 (tiktoken's)
        cannot be saved this way: keep their ranks file instead.
        """
        identity_bytes = all(self.vocab.get(i) == bytes([i]) for i in range(256))
        if not identity_bytes or Tokenizer(self.merges, self.pattern).vocab != self.vocab:
            raise ValueError(
                "this tokenizer's vocabulary is not 0..255 bytes plus its merges (tiktoken "
                "ranks?), so it cannot be saved as merges"
            )
        state = {
            "format": "course_lib.bpe.Tokenizer",
            "version": FORMAT_VERSION,
            "pattern": self.pattern,
            "merges": [[a, b, idx] for (a, b), idx in self.merges.items()],
            "special_tokens": self.special_tokens,
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1, ensure_ascii=False)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Read a file written by :meth:`save`."""
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path} is not a saved tokenizer (not JSON: {e})") from None
        if not isinstance(state, dict) or state.get("format") != "course_lib.bpe.Tokenizer":
            raise ValueError(f"{path} is not a saved course_lib.bpe tokenizer")
        if state.get("version") != FORMAT_VERSION:
            raise ValueError(
                f"{path} has format version {state.get('version')!r}; this code reads "
                f"version {FORMAT_VERSION}"
            )
        try:
            merges = {(int(a), int(b)): int(idx) for a, b, idx in state["merges"]}
            specials = {str(k): int(v) for k, v in state["special_tokens"].items()}
            pattern = state["pattern"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path} is a damaged tokenizer file: {e!r}") from None
        return cls(merges, pattern=pattern, special_tokens=specials)

    # ---------------------------------------------------------------- tiktoken
    def to_tiktoken(self, name: str = "course_bpe"):
        """The same tokenizer as a ``tiktoken.Encoding`` (same ids; Rust, much faster).

        pattern=None becomes ``ALL_PATTERN`` (one piece); lone surrogates become U+FFFD
        in tiktoken (see the module docstring).
        """
        import tiktoken

        return tiktoken.Encoding(
            name=name,
            pat_str=self.pattern if self.pattern is not None else ALL_PATTERN,
            mergeable_ranks=dict(self.ranks),
            special_tokens=dict(self.special_tokens),
        )


class _RankLimit(dict):
    """A read-only view of ranks that hides tokens with rank >= ``limit``."""

    def __init__(self, ranks: dict[bytes, int], limit: int):
        super().__init__()
        self._ranks, self._limit = ranks, limit

    def get(self, key, default=None):
        r = self._ranks.get(key)
        return r if r is not None and r < self._limit else default

    def __getitem__(self, key):
        r = self.get(key)
        if r is None:
            raise KeyError(key)
        return r
