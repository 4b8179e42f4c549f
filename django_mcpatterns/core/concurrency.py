"""Background work of the stampede, in hand-written sync/async pairs.

The stampede's algorithms are written once (``core/_async/``, the sync form
generated, see ``docs/architecture.md``); what runs *beside* a request cannot be
derived that way, so each piece has both forms here, named so the generator maps
the async one onto the sync one (``AsyncTicker`` -> ``Ticker``,
``async_run_in_background`` -> ``run_in_background``):

* :class:`Ticker` / :class:`AsyncTicker`: call ``beat`` every ``interval``
  seconds beside the caller (the recompute lock's keepalive): a daemon thread,
  or a task on the running loop;
* :func:`run_in_background` / :func:`async_run_in_background`: a stale value's
  recompute handed off the request path (``StampedePolicy.runner``): the
  runner's thread pool, or a task on the running loop, bounded by the runner's
  size so a struggling database cannot pile up recomputes;
* :data:`Guard` / :data:`AsyncGuard`: the mutex between the keepalive and the
  fill of one placeholder (a thread lock, or an asyncio lock: both sides are
  tasks of one loop);
* :func:`finish_then_undo` / :func:`async_finish_then_undo`: a claim (the
  recompute lock's ``add``, the placeholder's) that a cancelled task must not
  leave half-done.  A task is cancelled while it waits for the reply, after the
  request left: the server may have stored the claim, and nobody would own it
  (every other caller would wait for a computation nobody runs, until the
  claim's TTL).  So the claim runs to its end in a task of its own, and when
  its caller was cancelled meanwhile, what it took is handed back.  Sync code
  has no cancellation: the claim is just its result.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .refresh import RefreshQueueFull

__all__ = [
    "AsyncExtender",
    "AsyncGuard",
    "AsyncTicker",
    "AsyncUndo",
    "Extender",
    "Guard",
    "Runner",
    "Ticker",
    "Undo",
    "async_finish_then_undo",
    "async_run_in_background",
    "finish_then_undo",
    "run_in_background",
]

T = TypeVar("T")

logger = logging.getLogger("django_mcpatterns.stampede")

Guard = threading.Lock
AsyncGuard = asyncio.Lock

Runner = Callable[[Callable[[], None]], object]
"""Runs a zero-argument job off the request path, e.g. a :class:`~.refresh.RefreshRunner`."""

# An async refresh with a runner that does not say its size: at most this many per loop.
DEFAULT_BACKGROUND_TASKS = 100


class Ticker:
    """Call ``beat`` every ``interval`` seconds from a daemon thread until it says stop.

    ``beat()`` returns whether to keep going; :meth:`stop` ends the thread and
    waits for a beat in flight, so the caller acts after the last extension.
    """

    def __init__(self, beat: Callable[[], bool], interval: float, name: str) -> None:
        self._beat = beat
        self._interval = interval
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval) and self._beat():
            pass


class AsyncTicker:
    """:class:`Ticker` as a task on the running loop: ``beat`` is a coroutine function.

    Waiting between beats is ``asyncio.wait_for`` on an event, so the loop runs
    other tasks meanwhile; :meth:`stop` awaits the task (a beat in flight
    finishes first; cancelling the stopping caller cancels it too).
    """

    def __init__(self, beat: Callable[[], Awaitable[bool]], interval: float, name: str) -> None:
        self._beat = beat
        self._interval = interval
        self._name = name
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), self._interval)
                return
            except TimeoutError:
                pass
            try:
                if not await self._beat():
                    return
            except Exception:  # a thread's error would end it the same way
                logger.exception("%s: a beat failed; not extending any more", self._name)
                return


def run_in_background(runner: Runner, job: Callable[[], None]) -> None:
    """Hand ``job`` to ``runner`` (its thread pool); it raises ``queue.Full`` when full."""
    runner(job)


# The refresh tasks in flight, per event loop and per runner (by id): a strong
# reference each, so a task is not collected before it ends.
_TASKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, set[asyncio.Task[None]]]] = (
    weakref.WeakKeyDictionary()
)


async def async_run_in_background(runner: Runner, job: Callable[[], Awaitable[None]]) -> None:
    """Run ``job`` as a task on the running loop instead of ``runner``'s threads.

    A runner configured for the sync API (a :class:`~.refresh.RefreshRunner`)
    still bounds the async refreshes: at most its ``workers + max_queue``
    tasks in flight per loop, then :class:`~.refresh.RefreshQueueFull`.
    """
    loop = asyncio.get_running_loop()
    running = _TASKS.setdefault(loop, {}).setdefault(id(runner), set())
    limit = getattr(runner, "workers", 0) + getattr(runner, "max_queue", DEFAULT_BACKGROUND_TASKS)
    if len(running) >= limit:
        raise RefreshQueueFull(f"{limit} background refreshes are running on this event loop")
    task = loop.create_task(_logged(job), name="mcpatterns-refresh")
    running.add(task)
    task.add_done_callback(running.discard)


async def _logged(job: Callable[[], Awaitable[None]]) -> None:
    try:
        await job()
    except Exception:
        logger.exception("a background refresh failed")


Extender = Callable[[float], bool]
"""Extend a held lock to live ``ttl`` more seconds; return whether it was still ours."""
AsyncExtender = Callable[[float], Awaitable[bool]]


Undo = Callable[[T], object]
"""Hand back what a claim took, given the claim's answer."""
AsyncUndo = Callable[[T], Awaitable[object]]


def finish_then_undo(claim: T, undo: Undo[T]) -> T:
    """Sync code cannot be cancelled mid-request: the claim is its result (``undo`` unused)."""
    return claim


# Claims being handed back after their caller was cancelled (a reference each, as above).
_UNDOING: set[asyncio.Task[None]] = set()


async def async_finish_then_undo(claim: Awaitable[T], undo: AsyncUndo[T]) -> T:
    """Await ``claim`` to its end even if this task is cancelled meanwhile.

    Cancelled, re-raise at once (the caller goes away as asked) and, once the
    claim has its answer, run ``undo(answer)`` in a task: it releases what the
    claim took, if it took anything.
    """
    task = asyncio.ensure_future(claim)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: _undo_later(done, undo))
        raise


def _undo_later(done: asyncio.Future[T], undo: AsyncUndo[T]) -> None:
    if done.cancelled() or done.exception() is not None:
        return  # no answer: nothing known to hand back (it expires by itself)
    task = asyncio.ensure_future(_logged_undo(undo, done.result()))
    _UNDOING.add(task)
    task.add_done_callback(_UNDOING.discard)


async def _logged_undo(undo: AsyncUndo[T], taken: T) -> None:
    try:
        await undo(taken)
    except Exception:
        logger.exception("could not hand back a claim after its caller was cancelled")
