"""What page-caching decorators store: a page as plain data, or a "hit-for-pass" marker.

Shared by the Django and Flask view decorators; imports neither framework.

:class:`CachedPage`
    A response as status, headers and body.  A pickled framework response
    object would tie the cache to that framework's internals (and Django's
    ``TemplateResponse`` refuses to be pickled unrendered); plain data reads
    back in any release.
:data:`PASS`
    Stored instead of a page when the view's response must not be cached
    (private, sets a cookie, not a 200...).  Without it, the requests that
    wait for a page's one computation would find no page when that
    computation ends, and would then run the view one after another, each
    waiting for the previous one.  Finding ``PASS``, they run the view at once,
    in parallel, as if the page were not cached at all: Varnish's
    "hit-for-pass".  It expires like a page, so the next computation after
    that decides again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["PASS", "CachedPage", "PassMarker"]


@dataclass(frozen=True, slots=True)
class CachedPage:
    """A response as stored: plain data, so any release can read it back."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


class PassMarker:
    """The type of :data:`PASS`; unpickles to the one instance, so ``is PASS`` holds."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "PASS"  # pickled by reference to this module's global

    def __repr__(self) -> str:
        return "PASS"


PASS: Final = PassMarker()
