"""Owner-safe rewrites of a lock item by token, for holders that are not a Lock object.

The stampede's recompute lock is extended by a keepalive and may be released by
a background job: neither is the owner that acquired it, so they go by the
token (``gets`` then ``cas``).  That rewrite is the locks' own
(:func:`django_mcpatterns.core._async.locks.rewrite_owned`, one algorithm for
both), named here as the stampede and namespaces import it.
"""

from __future__ import annotations

from django_mcpatterns.core._async.locks import rewrite_owned as async_rewrite_owned
from django_mcpatterns.core.lockrules import authoritative
from django_mcpatterns.core.store import AsyncStore

__all__ = ["async_rewrite_owned", "strict_view"]


def strict_view(store: AsyncStore) -> AsyncStore:
    """:func:`~django_mcpatterns.core.locks.authoritative` for this form's store type."""
    return authoritative(store)
