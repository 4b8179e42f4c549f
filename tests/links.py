"""The links of a rendered page, and which of them lead nowhere.

A page the package renders (the status page, the debug-toolbar panel, the docs site) may
link to another site (an absolute ``http(s)`` URL), to a fragment of itself, or to a path its
own site serves: never to a path of this repository (``docs/operations.md``), which resolves
against the page's address and is a 404 on every site.
"""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

EXTERNAL = {"http", "https", "mailto", "data"}
LINKING = {"href", "src", "action"}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in LINKING and value is not None:
                self.links.append(value.strip())
            elif name in ("id", "name") and value:
                self.ids.add(value)


def parse(html: str) -> tuple[list[str], set[str]]:
    """The links of ``html`` (href, src, action) and the ids a fragment can name."""
    collector = _Collector()
    collector.feed(html)
    collector.close()
    return collector.links, collector.ids


def broken(html: str, page: str, serves: Callable[[str], bool]) -> list[str]:
    """The links of ``html``, rendered at the path ``page``, that its site does not serve.

    ``serves(path)`` says whether the site serves an absolute path (``/static/x.css``).
    Links to other sites and to fragments are not followed.
    """
    links, ids = parse(html)
    bad = []
    for link in links:
        parts = urlsplit(link)
        if parts.scheme in EXTERNAL or parts.scheme == "javascript":
            continue
        if parts.scheme or parts.netloc:
            bad.append(link)  # another scheme, or //host/...: nothing a page of ours needs
            continue
        if not parts.path:  # "#fragment" or "?query": this page
            if parts.fragment and parts.fragment not in ids:
                bad.append(link)
            continue
        if not serves(urljoin(page, parts.path)):
            bad.append(link)
    return bad


def served_by_django(path: str) -> bool:
    """Whether the current Django site serves ``path``: a URL pattern, or a static file."""
    from django.conf import settings
    from django.contrib.staticfiles import finders
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
        return True
    except Resolver404:
        pass
    static = settings.STATIC_URL or ""
    if static and path.startswith("/" + static.strip("/") + "/"):
        return finders.find(path[len("/" + static.strip("/") + "/") :]) is not None
    return False
