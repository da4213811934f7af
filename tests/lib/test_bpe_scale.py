"""Tests for course_lib.bpe at scale: training split at special tokens, parallel counting,
streaming encode (``encode_iterable``).

References: ``regex.findall`` on the whole text (checked against every cut point), ``encode``
of the whole text, tiktoken's Rust encoder, a naive trainer over documents written here, and
hand-worked cases.
"""

from __future__ import annotations

import functools
import random
import tracemalloc
from collections import Counter

import pytest
import regex

from course_lib import bpe
from course_lib.bpe import pretokenize
from course_lib.bpe import tokenizer as tokenizer_module

EOT = "<|endoftext|>"
PAD = "<|pad|>"
DOC = "<|doc|>"
# longer than pretokenize._MARGIN, and begins with DOC: a stream must hold it whole
LONG = "<|doc|> a special token longer than the margin, starting like another|>"
PATTERNS = {
    "gpt2": bpe.GPT2_SPLIT_PATTERN,
    "gpt4": bpe.GPT4_SPLIT_PATTERN,
    "o200k": bpe.O200K_SPLIT_PATTERN,
}
ENCODINGS = ["r50k_base", "cl100k_base", "o200k_base"]

# Texts that make a cut hard: contractions, whitespace runs longer than the margin, \r\n,
# digit groups, case changes (o200k), punctuation followed by newlines and slashes, emoji.
HARD = [
    "hey there  you're  I'll've WE'LL they're it's O'Neill's don't' can'",
    "   \t\t  \n\n\n   x  \r\n\r\n  \u00a0\u3000end  \r\n\r\r\n\n  a\n \n",
    "x" + " " * 40 + "\n" + " " * 20 + "\n\n" + "\t" * 18 + "y" + "\r\n" * 12 + " z" + " " * 30,
    "1234567 and 3.14159 and 1,000,000 and \u0661\u0662\u0663 12 345678901",
    "\U0001f469\u200d\U0001f469\u200d\U0001f467 family, \U0001f44d\U0001f3fd e\u0301 cafe\u0301",
    "HTMLParser ABCdef aBCD HELLO'S world's!!\n//\n!!!\r\n\r\nfoo/bar//\n\nbaz",
    "def f(x):\n    return x**2  # code\n\n\n\tpass\n",
    "\u4e2d\u6587\u5b57\u7b26 \ud55c\uad6d\uc5b4 \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",
]


@functools.cache
def ours(name: str) -> bpe.Tokenizer:
    return bpe.from_tiktoken(name)


@pytest.fixture(scope="session")
def doc_tok(corpus) -> bpe.Tokenizer:
    """Trained on documents joined by special tokens, with overlapping special tokens."""
    docs = [corpus[i : i + 10_000] for i in (0, 1_000_000, 2_000_000)] + HARD
    return bpe.train(EOT.join(docs), 360, special_tokens=[EOT, PAD, DOC, LONG])


def stream_text(corpus) -> str:
    """Prose, the hard texts and special tokens (LONG right after DOC, to be told apart)."""
    parts = [corpus[3_000_000:3_006_000], *HARD, DOC + "x", LONG, DOC, DOC + LONG[7:20]]
    return EOT.join(parts) + PAD


def chunkings(text: str, specials: list[str], seed: int = 0) -> list[list[str]]:
    """Single characters, random short and long chunks, and cuts in the middle of every
    special token."""
    rng = random.Random(seed)

    def cut_at(points):
        points = sorted(set(points))
        return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]

    def random_cuts(most):
        points, i = [], 0
        while i < len(text):
            i += rng.randint(1, most)
            points.append(min(i, len(text)))
        return cut_at(points)

    middles = [m.start() + len(m.group()) // 2 for s in specials for m in regex.finditer(
        regex.escape(s), text)]  # fmt: skip
    return [list(text), random_cuts(5), random_cuts(300), cut_at(middles), [text]]


# ------------------------------------------------------------ training and special tokens
def naive_train_docs(docs, vocab_size, pattern):
    """Reference: the chunks of every document (not deduplicated), all pairs recounted per
    merge, ties to the lowest pair; the documents are never joined."""
    words = [list(c.encode("utf-8")) for d in docs for c in regex.findall(pattern, d)]
    vocab = {i: bytes([i]) for i in range(256)}
    merges = {}
    while len(vocab) < vocab_size:
        counts = Counter()
        for w in words:
            counts.update(zip(w, w[1:], strict=False))
        if not counts:
            break
        pair = max(counts, key=lambda p: (counts[p], -p[0], -p[1]))
        new_bytes = vocab[pair[0]] + vocab[pair[1]]
        existing = [i for i, b in vocab.items() if b == new_bytes]
        new_id = existing[0] if existing else len(vocab)
        vocab[new_id] = new_bytes
        merges[pair] = new_id
        words = [bpe.merge(w, pair, new_id) for w in words]
    return merges


def test_no_merge_across_special_tokens():
    """By hand. "a", "b", "a", ... as documents: the pair (a, b) occurs only across a
    special token, so there is nothing to merge; joined without splitting there would be."""
    text = EOT.join(["a", "b"] * 50)
    tok = bpe.train(text, 300, pattern=None, special_tokens=[EOT])
    assert tok.merges == {} and tok.special_tokens == {EOT: 256} and len(tok.vocab) == 256
    assert bpe.train(text, 300, pattern=None).merges  # not split: "a<|endoftext|>b..." merges
    # With the GPT-4 pattern: the pieces are "ab" 50 times: one merge, then nothing left;
    # the special token's own pieces ("<|", "endoftext", "|>") are never counted.
    tok = bpe.train(("ab" + EOT) * 50, 300, special_tokens=[EOT])
    assert tok.merges == {(97, 98): 256} and tok.special_tokens == {EOT: 257}
    plain = bpe.train(("ab" + EOT) * 50, 300)
    assert any(b"endof" in t for t in plain.vocab.values())


def test_train_on_documents_equals_summed_counts(corpus):
    docs = [corpus[i : i + 2_000] for i in (0, 500_000, 1_500_000)] + HARD[:4]
    text = EOT.join(docs)
    tok = bpe.train(text, 331, special_tokens=[EOT])
    assert list(tok.merges.items()) == list(naive_train_docs(docs, 330, bpe.GPT4_SPLIT_PATTERN).items())
    assert tok.special_tokens == {EOT: 330}
    # the counts: "a<|endoftext|>b" is the sum of "a" and "b" counted alone
    for pattern in [*PATTERNS.values(), None]:
        summed = Counter()
        for d in docs:
            summed.update(regex.findall(pattern, d) if pattern else [d])
        assert bpe.count_pieces(text, pattern, [EOT]) == summed


def test_trained_tokenizer_encodes_special_tokens(doc_tok, corpus):
    assert doc_tok.special_tokens == {EOT: 356, PAD: 357, DOC: 358, LONG: 359}
    text = stream_text(corpus)
    ids = doc_tok.encode(text, allowed_special="all")
    assert ids == doc_tok.to_tiktoken().encode(text, allowed_special="all")
    assert ids.count(356) == text.count(EOT) and ids[-1] == 357
    assert ids.count(359) == 1 and ids.count(358) == 3  # LONG is not DOC + text
    assert doc_tok.decode(ids) == text
    # no learned token holds part of a special token that only occurs as one
    assert not any(b"<|" in t or b"|>" in t for t in doc_tok.vocab.values())


def test_longest_special_token_wins():
    assert bpe.split_at_specials("x<|a|>by<|a|>", ["<|a|>", "<|a|>b"]) == ["x", "y"]
    assert bpe.count_pieces("x<|a|>by", None, ["<|a|>", "<|a|>b"]) == Counter({"x": 1, "y": 1})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"special_tokens": [""]}, "non-empty str"),
        ({"special_tokens": [5]}, "non-empty str, got 5"),
        ({"special_tokens": {"": 400}}, "non-empty str"),
        ({"special_tokens": EOT}, "list or dict"),
        ({"num_workers": 0}, "num_workers must be an int >= 1, got 0"),
        ({"num_workers": -1}, "got -1"),
        ({"num_workers": 1.5}, "got 1.5"),
        ({"num_workers": True}, "got True"),
    ],
)
def test_train_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bpe.train("abc", 300, **kwargs)


def test_count_pieces_bad_num_workers():
    with pytest.raises(ValueError, match="num_workers must be an int >= 1, got 0"):
        bpe.count_pieces("abc", bpe.GPT4_SPLIT_PATTERN, num_workers=0)


def test_tokenizer_rejects_bad_special_tokens():
    with pytest.raises(ValueError, match="non-empty str"):
        bpe.Tokenizer({}, special_tokens={"": 300})
    with pytest.raises(ValueError, match="non-empty str, got 7"):
        bpe.Tokenizer({}, special_tokens={7: 300})


# ------------------------------------------------------------------- parallel counting
@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
def test_cut_after_letter_keeps_pieces(pattern, corpus):
    """Every place the counter may cut (a letter, then a space) splits the same both sides."""
    split = regex.compile(pattern)
    for text in [corpus[:3_000], *HARD, " ".join(HARD)]:
        full = split.findall(text)
        for m in pretokenize._LETTER_BEFORE_SPACE.finditer(text):
            cut = m.end()
            assert split.findall(text[:cut]) + split.findall(text[cut:]) == full, (text, cut)


@pytest.mark.parametrize("pattern", [*PATTERNS.values(), None, r"\S+|\s+"],
                         ids=[*PATTERNS.keys(), "none", "custom"])  # fmt: skip
def test_count_pieces_small_tasks(pattern, corpus, monkeypatch):
    """Serial counting in tasks of ~500 characters (many cuts) equals the naive count."""
    text = EOT.join([corpus[:20_000], *HARD, corpus[2_000_000:2_010_000]])
    docs = bpe.split_at_specials(text, [EOT])
    naive = Counter(p for d in docs for p in (regex.findall(pattern, d) if pattern else [d]))
    monkeypatch.setattr(pretokenize, "_MIN_TASK", 500)
    assert bpe.count_pieces(text, pattern, [EOT]) == naive
    n_tasks = sum(1 for _ in pretokenize._tasks(text, pattern, [EOT], 500))
    assert n_tasks > (50 if pattern in PATTERNS.values() else 1)  # it really did cut


def test_parallel_training_same_as_serial(corpus):
    """Two processes ("spawn") give the same merges, vocab and special ids as one."""
    text = EOT.join([corpus[:150_000], *HARD, corpus[1_000_000:1_150_000]])
    one = bpe.train(text, 400, special_tokens=[EOT, PAD])
    two = bpe.train(text, 400, special_tokens=[EOT, PAD], num_workers=2)
    assert list(two.merges.items()) == list(one.merges.items())
    assert two.vocab == one.vocab and two.special_tokens == one.special_tokens
    # and the counts themselves, for a pattern cut at special tokens only
    assert bpe.count_pieces(text, None, [EOT], num_workers=2) == bpe.count_pieces(text, None, [EOT])


# -------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("pattern", PATTERNS.values(), ids=PATTERNS.keys())
def test_certain_prefix_at_every_cut(pattern, corpus):
    """The pieces called certain for each prefix of a text are its leading pieces."""
    split = regex.compile(pattern)
    for text in [corpus[100_000:101_000], *HARD]:
        full = split.findall(text)
        for i in range(len(text) + 1):
            pieces, end = bpe.certain_prefix(text[:i], split)
            assert pieces == full[: len(pieces)], (text, i)
            assert "".join(pieces) == text[:end]
    # and it is not empty-handed: all but the last few pieces of prose are certain
    text = corpus[100_000:101_000]
    assert bpe.certain_prefix(text, split)[1] > len(text) - 40
    assert bpe.certain_prefix(text, None) == ([], 0)


def test_certain_prefix_pattern_with_gaps():
    """A pattern that skips characters (here: spaces) cannot use lengths; positions then."""
    text = "one two three four five six seven eight nine"
    pieces, end = bpe.certain_prefix(text, regex.compile(r"\w+"))
    assert pieces == ["one", "two", "three", "four", "five", "six"] and end == 27


@pytest.fixture
def small_blocks(monkeypatch):
    """Every chunk is a block: the cut logic runs after each chunk, at every position."""
    monkeypatch.setattr(tokenizer_module, "_STREAM_BLOCK", 1)


def test_stream_equals_encode_trained(doc_tok, corpus, small_blocks):
    text = stream_text(corpus)
    expected = doc_tok.encode(text, allowed_special="all")
    for chunks in chunkings(text, [EOT, PAD, DOC, LONG]):
        assert list(doc_tok.encode_iterable(chunks, allowed_special="all")) == expected
    pad_only = text.replace(EOT, "").replace(DOC, "").replace(LONG, "")
    expected = doc_tok.encode(pad_only, allowed_special={PAD})
    for chunks in chunkings(pad_only, [PAD], seed=1)[1:3]:
        assert list(doc_tok.encode_iterable(iter(chunks), allowed_special={PAD})) == expected


@pytest.mark.parametrize("name", ENCODINGS)
def test_stream_equals_tiktoken(name, corpus, small_blocks, request):
    if name == "r50k_base":
        request.getfixturevalue("r50k_ready")
    tok, ref = ours(name), bpe.tiktoken_encoding(name)
    specials = list(tok.special_tokens)
    text = "".join(f"{t}{specials[i % len(specials)]}" for i, t in enumerate(HARD))
    text = corpus[4_000_000:4_004_000] + EOT + text
    expected = ref.encode(text, allowed_special="all")
    assert tok.encode(text, allowed_special="all") == expected
    for chunks in chunkings(text, specials, seed=2):
        assert list(tok.encode_iterable(chunks, allowed_special="all")) == expected


def test_stream_default_blocks_from_a_file(tmp_path, doc_tok, corpus):
    """An open file (lines, \\r\\n kept with newline="") at the real block size."""
    text = corpus[:600_000].replace("\n", "\r\n") + EOT + corpus[600_000:700_000] + "  \n\n  "
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8", newline="")
    expected = doc_tok.encode(text, allowed_special="all")
    with open(path, encoding="utf-8", newline="") as f:
        assert list(doc_tok.encode_iterable(f, allowed_special="all")) == expected
    rng = random.Random(3)
    cuts = sorted(rng.sample(range(len(text)), 40))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert list(doc_tok.encode_iterable(chunks, allowed_special="all")) == expected


def test_stream_pattern_none(small_blocks):
    """pattern=None: a document is one piece, held until its special token or the end."""
    tok = bpe.train("aaabdaaabac" * 3, 262, pattern=None, special_tokens=[EOT])
    text = "aaabdaaabac" + EOT + "aaab" * 5 + EOT + "daaaba"
    expected = tok.encode(text, allowed_special="all")
    for chunks in chunkings(text, [EOT]):
        assert list(tok.encode_iterable(chunks, allowed_special="all")) == expected


def test_stream_work_stays_linear(monkeypatch, small_blocks):
    """Held text is scanned again with each block, so blocks grow with it: streaming one
    4000-character piece (pattern=None) a character at a time scans each character a few
    times, not once per later character."""
    tok = bpe.Tokenizer({(97, 97): 256}, pattern=None)
    scanned, encode_certain = [0], bpe.Tokenizer._encode_certain

    def spy(self, text, *args, **kwargs):
        scanned[0] += len(text)
        return encode_certain(self, text, *args, **kwargs)

    monkeypatch.setattr(bpe.Tokenizer, "_encode_certain", spy)
    text = "ab" * 2000
    assert list(tok.encode_iterable(text)) == tok.encode(text)
    assert scanned[0] < 4 * len(text), scanned[0]


def test_piece_cache_stops_growing(monkeypatch, corpus):
    """The cache of piece ids is bounded (a long stream has ever more distinct pieces)."""
    monkeypatch.setattr(tokenizer_module, "_CACHE_SIZE", 50)
    tok = bpe.train(corpus[:5_000], 300)
    text = corpus[200_000:210_000]
    ids = list(tok.encode_iterable([text]))
    assert len(tok._cache) == 50 and ids == tok.encode(text)
    monkeypatch.setattr(tokenizer_module, "_CACHE_SIZE", 1 << 18)
    assert bpe.Tokenizer(tok.merges).encode(text) == ids  # a fresh cache: the same ids


def test_stream_special_token_errors(doc_tok, small_blocks):
    # not allowed ("none" is the default, as in encode): raised when the stream reaches it,
    # even cut in two, after the ids before it
    stream = doc_tok.encode_iterable(["to be or not to be, that is the question " * 3, "<|endof",
                                      "text|> whether"])  # fmt: skip
    first = next(stream)
    assert first == doc_tok.encode("to")[0]
    with pytest.raises(ValueError, match="allowed_special"):
        list(stream)
    with pytest.raises(ValueError, match="<\\|pad\\|>"):
        list(doc_tok.encode_iterable(["a", EOT, "b", PAD], allowed_special={EOT}))
    # bad arguments are refused at the call, not at the first next()
    with pytest.raises(ValueError, match="allowed_special"):
        doc_tok.encode_iterable(["x"], allowed_special="some")
    with pytest.raises(ValueError, match="unknown special"):
        doc_tok.encode_iterable(["x"], allowed_special={"<|nope|>"})
    with pytest.raises(TypeError, match="iterable of str, got int"):
        doc_tok.encode_iterable(5)
    with pytest.raises(TypeError, match="chunks must be str, got bytes"):
        list(doc_tok.encode_iterable(["ok", b"bytes"]))
    assert list(doc_tok.encode_iterable([])) == [] and list(doc_tok.encode_iterable(["", ""])) == []


def test_stream_memory_is_bounded():
    """~20 MB streamed in 4K chunks: the text read but not yet encoded stays under 200 kB,
    and the memory allocated while streaming peaks under 1 MB (tracemalloc)."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(8, 16))) for _ in range(40)]
    doc = " ".join(rng.choice(words) for _ in range(60_000)) + ".\n\n"  # ~750 kB, ASCII
    tok = bpe.train(doc[:20_000], 900, special_tokens=[EOT])  # whole words: few ids
    n_bytes = {i: len(b) for i, b in tok.vocab.items()} | {tok.special_tokens[EOT]: len(EOT)}
    read, out, lags = [0], [0], []

    def chunks(total=20_000_000):
        while read[0] < total:
            for i in range(0, len(doc), 4096):
                lags.append(read[0] - out[0])
                read[0] += len(doc[i : i + 4096])
                yield doc[i : i + 4096]
            read[0] += len(EOT)
            yield EOT

    def consume(ids):
        for i in ids:
            out[0] += n_bytes[i]

    tracemalloc.start()
    try:
        consume(tok.encode_iterable(chunks(), allowed_special="all"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert read[0] > 20_000_000 and out[0] == read[0]  # every byte came out once
    assert max(lags) < 200_000, max(lags)
    assert peak < 1_000_000, peak
