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
import json
import operator
import os
from collections.abc import Iterable

import regex

from .core import GPT4_SPLIT_PATTERN, bpe_by_rank

__all__ = ["Tokenizer", "ALL_PATTERN"]

FORMAT_VERSION = 1
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
        cache, ranks, out = self._cache, self.ranks, []
        for piece in pieces:
            ids = cache.get(piece)
            if ids is None:
                data = piece.encode("utf-8", "surrogatepass")
                # tiktoken's shortcut: a piece that is a whole token is that token
                idx = ranks.get(data)
                ids = [idx] if idx is not None else bpe_by_rank(data, ranks)
                if len(piece) <= 256:  # keep the cache from holding huge pieces
                    cache[piece] = ids
            out.extend(ids)
        return out

    def encode(self, text: str, allowed_special: str | set[str] = "none") -> list[int]:
        """Encode ``text`` to ids. Chapter 01.

        ``allowed_special``: "none" (default), "all", or a set of special-token strings.
        Allowed special tokens are emitted as their ids; any other special token found in
        the text raises ValueError (as tiktoken does), because text that merely contains
        "<|endoftext|>" should not silently end a document.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if allowed_special == "all":
            allowed = set(self.special_tokens)
        elif allowed_special == "none":
            allowed = set()
        elif isinstance(allowed_special, (set, frozenset)):
            unknown = set(allowed_special) - set(self.special_tokens)
            if unknown:
                raise ValueError(f"allowed_special names unknown special tokens: {sorted(unknown)}")
            allowed = set(allowed_special)
        else:
            raise ValueError(
                f'allowed_special must be "all", "none" or a set of str, got {allowed_special!r}'
            )
        for name in self.special_tokens:
            if name not in allowed and name in text:
                raise ValueError(
                    f"text contains the special token {name!r}; pass allowed_special="
                    f"{{{name!r}}} or 'all' to encode it as a special token, or use "
                    "encode_ordinary to encode it as plain text"
                )
        if not allowed:
            return self.encode_ordinary(text)
        names = sorted(allowed, key=len, reverse=True)  # longest first if one prefixes another
        splitter = regex.compile("(" + "|".join(regex.escape(s) for s in names) + ")")
        out = []
        for i, part in enumerate(splitter.split(text)):
            if i % 2:  # odd parts are the captured special tokens
                out.append(self.special_tokens[part])
            elif part:
                out.extend(self.encode_ordinary(part))
        return out

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
