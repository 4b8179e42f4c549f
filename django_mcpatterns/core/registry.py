"""An explicit, locked, resettable registry for process-wide state.

Django builds one cache backend per thread, yet node health, connection pools and
the embedded store's data must be shared by every thread of the process.  They
live here instead of in hidden module globals, and tests can ``reset()`` them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects created once per key and shared by the whole process."""

    def __init__(self, on_reset: Callable[[T], object] | None = None) -> None:
        self._items: dict[Hashable, T] = {}
        self._lock = threading.Lock()
        self._on_reset = on_reset

    def get_or_create(self, key: Hashable, factory: Callable[[], T]) -> T:
        """Return the object for ``key``, building it with ``factory`` the first time."""
        try:
            return self._items[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._items:
                self._items[key] = factory()
            return self._items[key]

    def values(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    def reset(self) -> None:
        """Forget every object (calling ``on_reset`` on each, e.g. to close it)."""
        with self._lock:
            items, self._items = list(self._items.values()), {}
        if self._on_reset is not None:
            for item in items:
                self._on_reset(item)
