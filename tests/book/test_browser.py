"""The built book in headless Chromium: pages load cleanly and formulas are typeset offline."""

from __future__ import annotations

import functools
import http.server
import shutil
import threading

import pytest

from tests.conftest import CHAPTERS, skip_or_fail

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture(scope="module")
def server(html_dir):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(html_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        skip_or_fail("Chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def visit(browser, url: str) -> tuple[object, list[str]]:
    """Open ``url``; returns the page and every problem seen (console errors, failed requests)."""
    page = browser.new_page()
    problems: list[str] = []
    # A failed resource is reported below with its URL; its console echo says nothing more.
    page.on("console", lambda m: problems.append(f"console: {m.text}")
            if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed request: {r.url}"))
    # Browsers ask for /favicon.ico on their own; the book has none.
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None)
    page.goto(url, wait_until="networkidle")
    return page, problems


MATH_PAGES = (["book/intro.html", "book/notation.html", "book/frontiers.html"]
              + [f"notebooks/{c}/{c}.html" for c in CHAPTERS])
OTHER_PAGES = ["index.html", "book/setup.html", "book/glossary.html", "book/history.html",
               "book/instructors.html",
               "book/bibliography.html", "search.html"]


# Text outside code and formulas that still holds TeX's delimiters once MathJax is done: a
# formula the Markdown parser broke apart (a line of it read as a list item, say) shows as raw TeX.
LEFTOVER_TEX_JS = r"""() => {
  const root = document.querySelector("article") || document.body;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const found = [];
  while (walker.nextNode()) {
    const node = walker.currentNode;
    if (node.parentElement.closest("pre, code, mjx-container, script, style")) continue;
    if (/\$|\\\(|\\\)|\\\[|\\\]/.test(node.textContent)) found.push(node.textContent.trim().slice(0, 80));
  }
  return found;
}"""


@pytest.mark.parametrize("path", MATH_PAGES)
def test_page_loads_without_errors_and_typesets_math(browser, server, path):
    page, problems = visit(browser, f"{server}/{path}")
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000)
    page.evaluate("MathJax.startup.promise")
    typeset = page.evaluate("document.querySelectorAll('mjx-container').length")
    raw_tex = page.evaluate("document.querySelectorAll('.math:not(:has(mjx-container))').length")
    leftover = page.evaluate(LEFTOVER_TEX_JS)
    page.close()
    assert not problems, problems
    assert typeset > 0, "no formula was typeset"
    assert raw_tex == 0, "some formulas were left as raw TeX"
    assert leftover == [], f"TeX delimiters left in the text: {leftover}"


@pytest.mark.parametrize("path", OTHER_PAGES)
def test_page_loads_without_errors(browser, server, path):
    page, problems = visit(browser, f"{server}/{path}")
    leftover = page.evaluate(LEFTOVER_TEX_JS)
    page.close()
    assert not problems, problems
    assert leftover == [], f"TeX delimiters left in the text: {leftover}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_image_of_a_chapter_loads(browser, server, chapter):
    page, problems = visit(browser, f"{server}/notebooks/{chapter}/{chapter}.html")
    images = page.evaluate("[...document.images].map(i => [i.src, i.complete && i.naturalWidth > 0])")
    page.close()
    assert not problems, problems
    assert all(ok for _, ok in images), [src for src, ok in images if not ok]


def test_search_finds_a_chapter_by_a_term_in_it(browser, server):
    page, problems = visit(browser, f"{server}/search.html?q=IsoFLOP")
    page.wait_for_function("document.querySelectorAll('#search-results li a').length > 0", timeout=20000)
    links = page.evaluate("[...document.querySelectorAll('#search-results li a')].map(a => a.href)")
    page.close()
    assert not problems, problems
    assert any("06_scaling" in link for link in links), links


@pytest.mark.parametrize("path", ["book/intro.html", "notebooks/07_moe/07_moe.html", "book/notation.html"])
def test_screenshots_for_a_maintainer(browser, server, html_dir, path):
    """Full-page screenshots in ``_build/screenshots/``, to look at after a build."""
    out = html_dir.parent / "screenshots" / (path.replace("/", "_").removesuffix(".html") + ".png")
    out.parent.mkdir(exist_ok=True)
    page, problems = visit(browser, f"{server}/{path}")
    page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000)
    page.evaluate("MathJax.startup.promise")
    page.screenshot(path=str(out), full_page=True)
    page.close()
    assert not problems, problems
    assert out.stat().st_size > 20_000, "a blank page?"
