"""MyST markup to plain Markdown, for the released notebooks.

The book renders the chapters' MyST (citations, glossary terms, figure references, admonitions,
dropdowns); JupyterLab and Colab show it as raw text. Release therefore rewrites the ordinary
markdown cells of the student notebook into Markdown that every notebook front end renders:

- ``{cite:p}`Vaswani2017``` -> "(Vaswani et al., 2017)", ``{cite:t}`...``` -> "Vaswani et al.
  (2017)", from ``book/references.bib``;
- ``{term}`merge``` -> "*merge*" (the glossary is a page of the book);
- ``{numref}`fig-capacity``` -> the figure's caption, up to its first colon or full stop, read
  from the code cell that draws it (``metadata.mystnb.figure``): only the book numbers figures;
- ````{admonition} Title`` with ``:class:`` -> a block quote under the title in bold;
- ````{dropdown} Title`` -> an HTML ``<details>`` block that opens on a click;
- ``{glue:text}`name``` -> the value the book build's run glued under that name (:mod:`.glue`).

Cells with nbgrader metadata (exercises, written answers) are left exactly as they are.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import nbformat

from course_tools import config, notebook
from course_tools.book import glue_records

_ROLE = re.compile(r"\{(cite:p|cite:t|term|numref)\}`([^`]+)`")
_FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>admonition|dropdown)\}[ \t]*(?P<title>.*)$")


@functools.cache
def bibliography(path: Path | None = None) -> dict[str, tuple[str, str]]:
    """``{key: (authors as cited, year)}`` from a BibTeX file (default: the book's)."""
    text = Path(path or config.root() / "book" / "references.bib").read_text(encoding="utf-8")
    out = {}
    for key, body in re.findall(r"@\w+\{([^,\s]+),(.*?)\n\}", text, re.S):
        author = re.search(r"\bauthor\s*=\s*\{(.*)\},?\s*$", body, re.M)
        year = re.search(r"\byear\s*=\s*\{?(\d{4})", body)
        if not (author and year):
            raise ValueError(f"references.bib: entry {key} needs an author and a year")
        out[key] = (_authors(author.group(1)), year.group(1))
    return out


def _authors(field: str) -> str:
    """'Vaswani, Ashish and Shazeer, Noam and ...' -> 'Vaswani et al.'; two names -> 'A and B'."""
    field = re.sub(r"\{\\L\}", "Ł", field).replace("{", "").replace("}", "")
    names = [n.strip() for n in re.split(r"\s+and\s+", field)]
    last = [n.split(",")[0].strip() if "," in n else n.split()[-1] for n in names]
    if len(last) == 1:
        return last[0]
    return f"{last[0]} and {last[1]}" if len(last) == 2 else f"{last[0]} et al."


def _caption_names(nb) -> dict[str, str]:
    """``{figure name: short caption}`` from the code cells that draw the notebook's figures."""
    out = {}
    for cell in nb.cells:
        figure = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
        if "name" in figure:
            caption = figure.get("caption", figure["name"])
            out[figure["name"]] = re.split(r"[:.](?:\s|$)", caption, maxsplit=1)[0]
    return out


def _role(kind: str, target: str, figures: dict[str, str]) -> str:
    if kind == "term":
        shown = re.sub(r"\s*<[^>]*>$", "", target)  # {term}`text <Glossary entry>` shows the text
        return f"*{shown}*"
    if kind == "numref":
        if target not in figures:
            raise ValueError(f"{{numref}}`{target}`: no figure of that name in the notebook")
        return f'the figure "{figures[target]}"'
    refs = bibliography()
    cited = []
    for key in (k.strip() for k in target.split(",")):
        if key not in refs:
            raise ValueError(f"{{{kind}}}`{key}`: not in book/references.bib")
        authors, year = refs[key]
        cited.append(f"{authors}, {year}" if kind == "cite:p" else f"{authors} ({year})")
    return f"({'; '.join(cited)})" if kind == "cite:p" else ", ".join(cited)


def _glued(name: str, values: dict[str, str]) -> str:
    if ":" in name:
        raise ValueError(f"{{glue:text}}`{name}`: format the value in glue.text(), not in the role")
    if name not in values:
        raise ValueError(f"{{glue:text}}`{name}`: no value recorded; run `python -m course_tools "
                         "book --only CHAPTER` (it runs the chapter and records what it glues), then release")
    return values[name]


def plain(source: str, figures: dict[str, str] | None = None, values: dict[str, str] | None = None) -> str:
    """One markdown cell's MyST as plain Markdown (see the module's docstring)."""
    figures, values = figures or {}, values or {}
    out, lines, i = [], source.splitlines(), 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        fence, body = match["fence"], []
        i += 1
        while i < len(lines) and lines[i].strip() != fence:
            if not re.match(r"^:[\w-]+:", lines[i]):  # directive options (:class: tip) have no text
                body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        title = match["title"].strip()
        if match["name"] == "admonition":
            out += [f"> **{title}**", ">"] + [f"> {line}".rstrip() for line in body]
        else:
            out += [f"<details><summary>{title}</summary>", ""] + body + ["", "</details>"]
    text = glue_records.ROLE.sub(lambda m: _glued(m[1], values), "\n".join(out))
    return _ROLE.sub(lambda m: _role(m[1], m[2], figures), text)


def plain_notebook(path: Path, values: dict[str, str] | None = None) -> None:
    """Rewrite the ordinary markdown cells of the notebook at ``path`` in place, with ``values``
    the glued values its prose quotes."""
    nb = notebook.read(path)
    figures = _caption_names(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not notebook.nbgrader_meta(cell):
            cell.source = plain(cell.source, figures, values)
    nbformat.write(nb, str(path))
