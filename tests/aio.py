"""Test helpers for asyncio stores: run an AsyncStore as a Store, on one persistent loop."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from typing import Any


class Blocking:
    """An :class:`~django_mcpatterns.core.store.AsyncStore` answering as a sync Store.

    Every coroutine method runs to completion on one event loop kept for the
    adapter's life, so the store's connections (one per loop) persist across
    calls as they do in a server.  Other attributes pass through.
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.store, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute

        @functools.wraps(attribute)
        def run(*args: Any, **kwargs: Any) -> Any:
            return self.loop.run_until_complete(attribute(*args, **kwargs))

        return run

    def run(self, coroutine_function: Callable[[], Any]) -> Any:
        """Run ``coroutine_function()`` on the adapter's loop."""
        return self.loop.run_until_complete(coroutine_function())

    def shutdown(self) -> None:
        self.loop.run_until_complete(self.store.close())
        self.loop.close()
