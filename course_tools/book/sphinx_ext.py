"""Sphinx extension with the book's fixes to the theme.

- The header's download button gives the student notebook. The book is built without copying
  sources (``html_copy_source: false``), so the theme's links into ``_sources/`` would be dead.
  On a notebook page the button points at the student version staged next to the page
  (``notebooks/NN_name/NN_name.ipynb``); on other pages only "print to PDF" remains.
- Scripts added twice (sphinx-thebe declares its constants twice) are kept once, and the colour
  mode defaults to light: both otherwise raise errors in the browser console.
"""

from __future__ import annotations


def _fix_download_buttons(app, pagename, templatename, context, doctree):
    for group in context.get("header_buttons", []):
        if group.get("label") != "download-buttons":
            continue
        kept = [b for b in group["buttons"] if b.get("type") == "javascript"]  # print to PDF
        if context.get("page_source_suffix") == ".ipynb":
            notebook = {
                "type": "link",
                "url": context["pathto"](f"{pagename}.ipynb", 1),
                "text": ".ipynb",
                "icon": "fas fa-code",
                "tooltip": "Download the student notebook",
                "label": "download-notebook-button",
            }
            kept.insert(0, notebook)
        group["buttons"] = kept


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    seen, kept = set(), []
    for script in context.get("script_files", []):
        key = (getattr(script, "filename", script) or "", getattr(script, "attributes", {}).get("body"))
        if key not in seen:
            seen.add(key)
            kept.append(script)
    context["script_files"] = kept


def _default_mode(app, config):
    config.html_context.setdefault("default_mode", "light")


def setup(app):
    app.connect("config-inited", _default_mode)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    # The theme fills header_buttons at priority 501; run after it.
    app.connect("html-page-context", _fix_download_buttons, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
