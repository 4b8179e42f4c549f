"""What the asyncio tests share: a loop-lag meter and a counting compute.

No pytest plugin: each test runs its scenario with ``asyncio.run``, so every
task in it is a real task of one real event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

TICK = 0.001


class LagMeter:
    """A task that wakes every millisecond and records the longest it was kept waiting.

    A call that blocks the event loop (a ``time.sleep``, a socket read without
    ``await``) shows up as a wake-up that came that much later than asked.
    """

    def __init__(self) -> None:
        self.worst = 0.0
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LagMeter:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(TICK)
            self.worst = max(self.worst, loop.time() - before - TICK)
            self.ticks += 1


class Computes:
    """A coroutine-function compute that counts its calls and takes ``seconds``."""

    def __init__(self, value: Any = "computed", seconds: float = 0.0) -> None:
        self.value = value
        self.seconds = seconds
        self.calls = 0

    async def __call__(self) -> Any:
        self.calls += 1
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return self.value


def run(scenario: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``scenario()`` on a new event loop and return its result."""
    return asyncio.run(scenario())
