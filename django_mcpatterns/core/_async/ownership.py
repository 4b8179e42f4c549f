"""Owner-safe rewrites of a lock item by token, for holders that are not a Lock object.

The stampede's recompute lock is extended by a keepalive and may be released by
a background job: neither is the owner that acquired it, so they go by the
token (``gets`` then ``cas``), as :func:`~django_mcpatterns.core.locks.rewrite_owned`
does for the sync API.
"""

from __future__ import annotations

from typing import Any, cast

from django_mcpatterns.core.keys import Key
from django_mcpatterns.core.locks import Ownership, authoritative
from django_mcpatterns.core.store import AsyncStore


def strict_view(store: AsyncStore) -> AsyncStore:
    """:func:`~django_mcpatterns.core.locks.authoritative` for this form's store type."""
    view: Any = authoritative(cast(Any, store))  # the same check for either store type
    return cast(AsyncStore, view)


async def async_rewrite_owned(
    store: AsyncStore, key: Key, token: bytes, exptime: int, value: bytes | None = None
) -> Ownership:
    """Rewrite the lock item at ``key`` only while ``token`` holds it; say who holds it.

    ``gets`` then ``cas``: a new ``exptime`` (negative deletes) and, with
    ``value``, a new content.  ``"ours"``: rewritten; ``"taken"``: another owner
    holds it; ``"free"``: nobody does.  ``store`` must be the strict view
    (:func:`strict_view`).
    """
    found, cas = await store.gets(key)
    if found != token or cas is None:
        return "free" if found is None else "taken"
    stored = await store.cas(key, token if value is None else value, cas, exptime)
    if stored:
        return "ours"
    return "free" if stored is None else "taken"  # it lapsed, or changed, after our gets
