"""Work to do when an event loop shuts down: close its connections before it is closed.

asyncio has no "loop closing" callback, and connections left open when a loop
ends are freed by the garbage collector, each with a ``ResourceWarning``
(``unclosed transport``, ``unclosed <socket>``).  What runners do before closing
a loop is documented, though: ``asyncio.run``, ``asyncio.Runner`` and asgiref's
``async_to_sync`` (which runs ``asyncio.run`` in a thread) all call
``loop.shutdown_asyncgens()``, which closes every asynchronous generator the
loop has started.  So :func:`at_shutdown` starts one such generator per loop,
suspended in a ``try``/``finally``: its ``finally`` runs the loop's cleanups,
awaited, while the loop still runs.  A loop closed without that step (a
hand-made loop, ``loop.close()`` alone) gets no call: the drivers then end such
connections when another loop finds them (``Channel.abandon``), and this module
forgets such a loop when another one registers.  A cleanup runs on its loop and
must not hold the loop itself (use ``asyncio.get_running_loop()`` there).
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable

__all__ = ["at_shutdown"]

Cleanup = Callable[[], Awaitable[None] | None]

# Each loop's cleanups, by key (a key registers once), and the generator that runs them.
_cleanups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Hashable, Cleanup]] = (
    weakref.WeakKeyDictionary()
)
_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = (
    weakref.WeakKeyDictionary()
)


async def at_shutdown(key: Hashable, cleanup: Cleanup) -> None:
    """Run ``cleanup()`` (awaited if it returns an awaitable) when the running loop shuts down.

    One cleanup per ``key`` and loop: registering a key again replaces it.  Call
    from a coroutine of the loop; the first call of a loop starts its watcher.
    """
    loop = asyncio.get_running_loop()
    cleanups = _cleanups.get(loop)
    if cleanups is None:
        for closed in [other for other in list(_watchers) if other.is_closed()]:
            _forget(closed)  # closed without shutdown_asyncgens(): nothing will run
        cleanups = _cleanups[loop] = {}
        watcher = _watch(cleanups)
        await watcher.__anext__()  # started: the loop's shutdown_asyncgens() closes it
        _watchers[loop] = watcher  # held: the loop itself keeps only a weak reference
    cleanups[key] = cleanup


async def _watch(cleanups: dict[Hashable, Cleanup]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        try:
            while cleanups:
                _, cleanup = cleanups.popitem()
                done = cleanup()
                if inspect.isawaitable(done):
                    await done
        finally:
            _forget(asyncio.get_running_loop())


def _forget(loop: asyncio.AbstractEventLoop) -> None:
    # The watcher holds its loop (asyncio's finalizer hook): drop both once the loop is done.
    _watchers.pop(loop, None)
    _cleanups.pop(loop, None)
