"""Sphinx extension: every link to an anchor of the site lands on an element that exists.

Sphinx checks cross-references, but not the ``#fragment`` of the HTML it writes:
viewcode's links from a source page back to its entry, a Markdown link to a heading, a
link to an entry that autodoc did not write (a ``:no-index:`` one) all leave a page that
opens at its top. Once the HTML is written, this reads every page of the output,
collects its ``id`` attributes, and warns (so the strict build fails) of each local link
whose fragment names none in its target page.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from typing import Any
from urllib.parse import unquote, urldefrag

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


class _Page(HTMLParser):
    """The ids of one page and its links (``href`` values)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(str(values[key]))
        if tag == "a" and values.get("href"):
            self.links.append(str(values["href"]))


def broken_anchors(root: str) -> list[tuple[str, str]]:
    """``(page, href)`` for every link under ``root`` whose fragment is not in its page."""
    pages: dict[str, _Page] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("_static", "_sources", "_images")]
        for file in files:
            if file.endswith(".html"):
                path = os.path.join(folder, file)
                page = pages[path] = _Page()
                with open(path, encoding="utf-8") as f:
                    page.feed(f.read())
    broken = []
    for path, page in sorted(pages.items()):
        for href in page.links:
            if href.startswith(("http:", "https:", "mailto:", "javascript:")):
                continue
            url, fragment = urldefrag(href)
            if not fragment:
                continue
            target = os.path.normpath(os.path.join(os.path.dirname(path), url)) if url else path
            if target in pages and unquote(fragment) not in pages[target].ids:
                broken.append((os.path.relpath(path, root), href))
    return broken


def check(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page, href in broken_anchors(str(app.outdir)):
        logger.warning("link to a missing anchor: %s in %s", href, page)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
