"""Pattern objects built once per store, shared by every backend instance over it.

Django builds a cache backend per thread and, in async code, per task (its
cache handler is context-local): a pattern object per instance would be built
for every request of an async view and forget what it learnt (the layout of
sharded sets, which saves a round trip per read).  The stores are shared per
process and ``LOCATION`` already, so the pattern objects are kept on the store
object itself, under a lock: they go when it goes (``reset_shared_clusters()``,
a test's throwaway cache), which a registry keyed by the store could not do,
since a pattern object holds its store.  A store without a ``__dict__`` gets a
new object each time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

__all__ = ["per_store"]

T = TypeVar("T")

_ATTRIBUTE = "_mcpatterns_pattern_objects"
_guard = threading.Lock()


def per_store(store: object, key: Hashable, build: Callable[[], T]) -> T:
    """The object ``build()`` made for ``store`` and ``key``, made on first use."""
    try:
        attributes: dict[str, Any] = vars(store)
    except TypeError:  # no __dict__
        return build()
    with _guard:
        made: dict[Hashable, Any] = attributes.setdefault(_ATTRIBUTE, {})
        # By identity too: a shallow copy of the store (Cluster.strict()) shares the dict.
        mine = (id(store), key)
        if mine not in made:
            made[mine] = build()
        found: T = made[mine]
        return found
