"""What the asyncio tests share: a guard against blocking calls on the loop, a ticker, a compute.

No pytest plugin: each test runs its scenario with ``asyncio.run``, so every
task in it is a real task of one real event loop.

"Never blocks the event loop" is shown by catching the blocking call itself
(:func:`loop_never_blocks`), not by timing the loop: a stopwatch fails on a busy
machine and passes a blocking call that happens to be short.
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

import blockbuster
import blockbuster.blockbuster
import pytest

T = TypeVar("T")


# Blocking calls a framework makes once per process and caches, not per request: Django
# reads its TIME_ZONE file (zoneinfo) on the first cache key of a page.
ONCE_PER_PROCESS = [("django/utils/timezone.py", "get_default_timezone")]


@contextlib.contextmanager
def loop_never_blocks() -> Iterator[None]:
    """Fail when anything calls a blocking function on a thread that runs an event loop.

    blockbuster wraps ``time.sleep``, socket and file calls in blocking mode,
    ``os.read``/``os.write`` on blocking descriptors, waits on a held
    ``threading`` lock (so ``Event.wait``, ``Condition.wait``, ``Thread.join``),
    ``sqlite3`` and more: on a thread with a running loop each raises
    ``BlockingError``.  Each such call is also recorded here and fails the test at
    the end, so code that catches the error (a store turning errors into misses)
    cannot hide it.  Other threads (a compute run off the loop) may block.
    """
    calls: list[str] = []

    class Recorded(blockbuster.BlockingError):
        def __init__(self, func: str) -> None:
            super().__init__(func)
            where = "".join(traceback.format_stack(limit=12)[:-2])
            calls.append(f"{func}, called from:\n{where}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(blockbuster.blockbuster, "BlockingError", Recorded)
        with blockbuster.blockbuster_ctx() as buster:
            for function in buster.functions.values():
                for filename, functions in ONCE_PER_PROCESS:
                    function.can_block_in(filename, functions)
            yield
    assert not calls, "blocking calls on the event loop's thread:\n" + "\n".join(calls)


class Ticker:
    """A task that yields to the loop every millisecond and counts its turns.

    ``await ticker.reached(n)`` returns once it has run ``n`` turns: a compute
    that awaits it finishes only if the loop kept running other tasks while its
    callers waited, however fast or busy the machine is.
    """

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def reached(self, ticks: int) -> None:
        if self.ticks < ticks:
            done = asyncio.get_running_loop().create_future()
            self._waiters.append((ticks, done))
            await done

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self.ticks += 1
            for ticks, done in list(self._waiters):
                if self.ticks >= ticks and not done.done():
                    done.set_result(None)


class Computes:
    """A coroutine-function compute that counts its calls.

    It takes ``seconds`` (an ``asyncio.sleep``), or, given ``until``, as long as
    ``until()`` takes to be awaited (e.g. ``lambda: ticker.reached(50)``).
    """

    def __init__(
        self,
        value: Any = "computed",
        seconds: float = 0.0,
        until: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self.value = value
        self.seconds = seconds
        self.until = until
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.until is not None:
            await self.until()
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return self.value


async def others_finished(patience: int = 3000) -> None:
    """Return once every other task of the running loop has finished.

    What a cancelled task hands to a background task (an undo, a settle, a refresh)
    is done then, however busy the machine: a fixed sleep is a race.  ``patience``
    turns of 10 ms are a hang guard, not a timing.
    """
    me = asyncio.current_task()
    quiet = 0
    for _ in range(patience):
        others = [task for task in asyncio.all_tasks() if task is not me]
        # A task's done callbacks run a loop turn after it ends, and may start another
        # (an undo): none left over a few turns in a row, then.
        quiet = 0 if others else quiet + 1
        if quiet > 3:
            return
        await asyncio.sleep(0.01 if others else 0)
    raise AssertionError(f"tasks still running: {others}")


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a new event loop and return its result."""
    return asyncio.run(scenario())


class MovableClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves forward: a timeout ends when the test says so.

    A withheld reply ends only by the client's timeout: with a short one, a loaded
    machine also times out the healthy requests around it.  On this loop those get a
    patient timeout, and the test moves the clock past it once the request under test
    is where it wants it (e.g. memcached answered it and the reply was dropped).
    """

    moved = 0.0

    def time(self) -> float:
        return super().time() + self.moved

    def move(self, seconds: float) -> None:
        """Move the clock forward (call it on the loop's thread: from a task)."""
        self.moved += seconds


def run_on_movable_clock(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a new :class:`MovableClockLoop` and return its result."""
    with asyncio.Runner(loop_factory=MovableClockLoop) as runner:
        return runner.run(scenario())


async def time_out_withheld(proxy: Any, seconds: float) -> None:
    """Once memcached answered the withheld request (its reply dropped), let it time out.

    ``proxy`` is a :class:`tests.drills.proxy.Proxy`; the running loop a
    :class:`MovableClockLoop`, moved ``seconds`` (the client's timeout): the request
    fails now, after memcached applied it, whatever the machine's load.
    """
    assert await asyncio.to_thread(proxy.wait_withheld_answered)
    loop = asyncio.get_running_loop()
    assert isinstance(loop, MovableClockLoop)
    loop.move(seconds)
