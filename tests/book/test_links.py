"""Every internal link of the built book leads somewhere: each relative ``href`` or ``src`` in every
page of ``_build/html`` names a file that exists and, with a ``#fragment``, an element with that id."""

from __future__ import annotations

import functools
import html.parser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Refs(html.parser.HTMLParser):
    """The ids of a page, and the (tag, attribute, value) of every link and source in it."""

    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)
            elif name in ("href", "src") and value:
                self.refs.append((tag, name, value))


@functools.cache
def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser


def test_every_internal_link_and_anchor_resolves(html_dir):
    # _static/ holds the theme's Jinja macro files (.html but not pages): skip them
    pages = sorted(p for p in html_dir.rglob("*.html") if "_static" not in p.relative_to(html_dir).parts)
    assert len(pages) > 10
    broken = []
    for page in pages:
        for tag, attr, value in _parse(page).refs:
            parts = urlsplit(value)
            if parts.scheme or parts.netloc or value.startswith(("mailto:", "javascript:", "data:")):
                continue  # external: test_build checks the book loads nothing from other sites
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            where = f"{page.relative_to(html_dir)}: <{tag} {attr}={value!r}>"
            if not target.is_file():
                broken.append(f"{where}: no such file")
            elif parts.fragment and target.suffix == ".html":
                if unquote(parts.fragment) not in _parse(target).ids:
                    broken.append(f"{where}: no such anchor")
    assert not broken, f"{len(broken)} broken links, e.g. {broken[:10]}"
