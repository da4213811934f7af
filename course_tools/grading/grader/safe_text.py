"""Text from submissions, made safe to write: to a file, a CSV cell, an HTML page.

**Grader side**: runs in the grader's own process, never beside student code.

A submission is JSON, and JSON may hold what no file encoding can (a lone surrogate ``"\\ud800"``
is valid JSON and invalid UTF-8), colours and cursor moves (ANSI escape sequences), control
characters and right-to-left overrides, HTML and spreadsheet formulas. Whatever a student sent,
writing it must neither fail (one student would stop the class) nor act on the reader:

- :func:`scrub` replaces lone surrogates in a JSON-like value (keys included), so that a notebook
  staged for nbgrader and every record written from it encode;
- :func:`plain` is one line of readable text: no escape sequence, no control character;
- :func:`cell` is :func:`plain` as a CSV cell no spreadsheet runs (:func:`spreadsheet_safe`);
- :func:`write_json` writes a record atomically (a temporary file, then a rename), so a failure
  half-way leaves the previous record, never a truncated one that stops every later grading.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

SURROGATE = re.compile(r"[\ud800-\udfff]")  # a pair is decoded to one character: any left is lone
# Escape sequences (colours, cursor moves, titles), then what is left of control characters:
# C0, DEL, C1, line and paragraph separators, bidirectional overrides and isolates.
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What makes a spreadsheet read a cell as a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def no_surrogates(text: str) -> str:
    """``"a\\ud800b" -> "a\\ufffdb"`` (the replacement character)."""
    return SURROGATE.sub("\ufffd", text)


def scrub(value):
    """``value`` (JSON: dicts, lists, strings, numbers) with every lone surrogate replaced, in
    keys as in values; a notebook stays a notebook (dicts stay dict-like)."""
    if isinstance(value, str):
        return no_surrogates(value)
    if isinstance(value, dict):
        out = type(value)()
        for k, v in value.items():
            out[no_surrogates(k) if isinstance(k, str) else k] = scrub(v)
        return out
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def plain(text) -> str:
    """One line of readable text: ``"\\x1b[31m<b>x</b>\\n=1"`` -> ``"<b>x</b> =1"`` (escape
    sequences dropped, each control character a space, lone surrogates replaced). HTML stays:
    escape it where it is shown in a page."""
    text = text if isinstance(text, str) else str(text)
    return CONTROL.sub(" ", ANSI.sub("", no_surrogates(text)))


def spreadsheet_safe(value):
    """``value`` as a CSV cell no spreadsheet runs: text starting with ``= + - @``, a tab or a
    carriage return, after any spaces, gets a leading ``'`` (``"=2+5" -> "'=2+5"``, ``" =1" ->
    "' =1"``); numbers stay numbers."""
    if isinstance(value, str) and value.lstrip(" ").startswith(FORMULA_START):
        return "'" + value
    return value


def cell(value):
    """A CSV cell of text from a submission: :func:`plain`, then :func:`spreadsheet_safe`; numbers
    and None stay as they are."""
    return spreadsheet_safe(plain(value)) if isinstance(value, str) else value


def write_json(path: Path, value) -> None:
    """``value`` as JSON at ``path``, whole or not at all. Non-ASCII text stays readable; anything
    UTF-8 cannot hold is written as its JSON escape (``\\ud800``), so the file always encodes and
    reads back to the same value."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(value, indent=1, ensure_ascii=False)
    tmp.write_bytes(text.encode("utf-8", "backslashreplace"))
    os.replace(tmp, path)
