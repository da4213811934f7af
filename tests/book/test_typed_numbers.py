"""No measured number is typed into the prose by hand.

A loss, a time, a ratio, a slope or a share that a page's code prints must reach its prose through
``glue.text`` and ``{glue:text}`` (chapters) or a substitution the build fills in (``{{ ... }}``,
the chapter times on the book's own pages), so the text is always the page's own run. This test
reads the prose of every chapter (the solution notebooks' markdown cells) and of every page under
``book/`` and finds each number that looks measured: one with a decimal point, or one followed by
a unit of time, a percent sign, "nats"/"bits", or "x"/"times". Each must be glued, or be listed in
``tests/book/typed_numbers/<page>.yaml`` with the reason it is typed (a fact from a paper or a
deck, a worked example, a setting the code is given). On the Frontiers page, a number that its
shown output (a ``text`` block, which ``test_frontiers`` checks against a fresh run) prints counts
as quoted from that output.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from course_tools import config
from tests.conftest import ROOT

ALLOWED = ROOT / "tests" / "book" / "typed_numbers"
NUMBER = re.compile(
    r"(?<![\w.\-/#])(?:\d[\d,]*\.\d+|\d[\d,]*(?:\s?(?:%|s\b|ms\b|seconds?\b|minutes?\b|min\b|hours?\b"
    r"|nats?\b|bits?\b|x\b|×|times\b)))")
# Not prose: display and inline math, code, roles' targets, substitutions, links' URLs, HTML tags.
NOT_PROSE = [re.compile(p, re.S) for p in (
    r"^(```|~~~).*?^\1", r"\$\$.*?\$\$", r"\$[^$\n]+\$", r"``[^`]+``", r"`[^`\n]+`", r"\{\{[^}]*\}\}",
    r"\]\([^)]*\)", r"<[^>\n]+>", r"^:[\w-]+:.*$", r"^\(\S+\)=$")]


def prose(text: str) -> str:
    for pattern in NOT_PROSE:
        text = re.sub(pattern.pattern, " ", text, flags=pattern.flags | re.M)
    return text


def pages() -> dict[str, str]:
    """``{page: its prose}``: every chapter (its solution's markdown) and every page of book/."""
    out = {}
    for chapter in config.chapters():
        nb = json.loads(config.solution_path(chapter).read_text(encoding="utf-8"))
        out[chapter] = "\n\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for path in sorted((ROOT / "book").glob("*.md")):
        out[path.stem] = path.read_text(encoding="utf-8")
    return out


def typed_numbers(text: str) -> list[str]:
    return [m.group(0).strip() for m in NUMBER.finditer(prose(text))]


def allowed(page: str) -> dict[str, str]:
    path = ALLOWED / f"{page}.yaml"
    return {str(k): v for k, v in (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).items()} \
        if path.is_file() else {}


def shown_output(text: str) -> str:
    return "\n".join(re.findall(r"^```text\n(.*?)^```$", text, re.M | re.S))


PAGES = pages()


@pytest.mark.parametrize("page", sorted(PAGES))
def test_measured_numbers_are_glued_not_typed(page):
    text, ok = PAGES[page], allowed(page)
    output = shown_output(text)
    typed = [n for n in typed_numbers(text)
             if n not in ok and not (output and re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", output))]
    assert not typed, (
        f"{page}: numbers typed into the prose: {sorted(set(typed))}. A number the page measures "
        "comes from its run (glue.text and {glue:text}`name`); a fact, an example or a setting "
        f"goes into tests/book/typed_numbers/{page}.yaml with the reason it is typed.")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_listed_number_is_still_on_its_page(page):
    stale = sorted(set(allowed(page)) - set(typed_numbers(PAGES[page])))
    assert not stale, f"tests/book/typed_numbers/{page}.yaml lists numbers no longer on the page: {stale}"


def test_the_detector_finds_measurements_and_skips_math_code_and_glue():
    text = ("The loss fell to 1.77 in 62 s, 3x faster, 92% of it; $0.5 + 1.5$ and `lr=3e-4` "
            "and {glue:text}`gpt_loss` and {{ chapter_03_seconds }} and 12 layers.\n"
            "```python\nx = 2.5\n```\n")
    assert typed_numbers(text) == ["1.77", "62 s", "3x", "92%"]
