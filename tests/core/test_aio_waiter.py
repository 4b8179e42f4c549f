"""The future a get's task waits on (``src/speedups/waiter.c`` on the compiled path, an
asyncio future on the coroutine path) behaves as asyncio's Future does.

A task's waiter is reached as asyncio leaves it (``task._fut_waiter``) while a stalled
server holds the batch's reply.  Python code that a waiter's method runs (a callback's
``__eq__``) may add, remove or resolve while the method works; callbacks run in the order
added, whatever was removed; a cancel message is one argument, whatever its type; and a
waiter is awaitable, as ``asyncio.isfuture`` promises.  The compiled awaitable's
``throw`` checks its arguments as a coroutine's does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.client import aio
from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.core.protocol.commands import StoreCommands
from tests.conftest import flush
from tests.core.test_aio_trip import run
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer


@pytest.fixture(params=["compiled", "coroutine"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled awaitable (its waiter a Waiter), or the coroutine ``_trip``."""
    if request.param == "compiled":
        if aio.trip is None:
            pytest.skip(f"the compiled path is not built: {compiled.why_pure}")
    else:
        monkeypatch.setattr(aio, "trip", None)
        monkeypatch.setattr(AsyncCluster, "run", aio.run_in_python)
    return str(request.param)


@asynccontextmanager
async def stalled_get(
    server: MemcachedServer,
) -> AsyncIterator[tuple[asyncio.Task[Any], Any, threading.Event]]:
    """A get's task, the waiter it waits on while the server's reply is held, the gate."""
    with Proxy(server.port) as proxy:
        cluster = AsyncCluster([proxy.spec])
        await cluster.set("w:k", b"v")
        proxy.gate = gate = threading.Event()
        task = asyncio.ensure_future(cluster.get("w:k"))
        while getattr(task, "_fut_waiter", None) is None:
            await asyncio.sleep(0)
        try:
            yield task, task._fut_waiter, gate  # type: ignore[attr-defined]
        finally:
            gate.set()
            await cluster.close()


def test_a_callback_comparison_that_resolves_the_waiter_is_survived(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    """remove_done_callback compares with ``==``: Python code, which here resolves the
    waiter (its callbacks then scheduled and dropped) halfway through."""
    flush(memcached_1)

    async def work() -> Any:
        async with stalled_get(memcached_1[0]) as (task, waiter, gate):
            waiter.add_done_callback(lambda _: None)
            waiter.add_done_callback(lambda _: None)
            compared = 0

            class Resolves:
                def __eq__(self, other: object) -> bool:
                    nonlocal compared
                    compared += 1
                    if compared == 2 and not waiter.done():
                        waiter.set_result(None)
                    return False

                __hash__ = object.__hash__

            removed = waiter.remove_done_callback(Resolves())
            task.cancel()
            gate.set()
            await asyncio.gather(task, return_exceptions=True)
            return isinstance(removed, int), waiter.done()

    assert run(work) == (True, True)  # how many it counts then is asyncio's own affair


def test_callbacks_run_in_the_order_added_after_a_removal(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    """The task's own wakeup (the first callback) removed, then added again last: every
    callback runs in the order added, as asyncio's."""
    flush(memcached_1)
    order: list[str] = []

    def note(name: str) -> Callable[[Any], None]:
        return lambda _: order.append(name)

    async def work() -> Any:
        async with stalled_get(memcached_1[0]) as (task, waiter, gate):
            a, b, c = note("A"), note("B"), note("C")
            waiter.add_done_callback(a)
            waiter.add_done_callback(b)
            wakeups = []

            class Grab:  # equal to the task's wakeup, whatever its type
                def __eq__(self, other: object) -> bool:
                    if other is a or other is b:
                        return False
                    wakeups.append(other)
                    return True

                __hash__ = object.__hash__

            assert waiter.remove_done_callback(Grab()) == 1
            waiter.add_done_callback(c)
            waiter.add_done_callback(wakeups[0])
            gate.set()
            got = await task
            return got, list(order)

    assert run(work) == (b"v", ["A", "B", "C"])


def test_a_tuple_cancel_message_is_one_argument(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    flush(memcached_1)

    async def work() -> Any:
        async with stalled_get(memcached_1[0]) as (task, waiter, _gate):
            task.cancel(msg=("a", "b"))
            await asyncio.sleep(0)
            with pytest.raises(asyncio.CancelledError) as raised:
                waiter.result()
            with pytest.raises(asyncio.CancelledError):
                await task
            return waiter.cancelled(), raised.value.args

    assert run(work) == (True, (("a", "b"),))


def test_a_waiter_is_awaitable(memcached_1: list[MemcachedServer], path: str) -> None:
    """``asyncio.isfuture`` says so: another task awaits it, pending then done; a
    cancelled one raises CancelledError to its awaiter."""
    flush(memcached_1)

    async def await_it(waiter: Any) -> Any:
        return await waiter

    async def work() -> Any:
        async with stalled_get(memcached_1[0]) as (task, waiter, gate):
            assert asyncio.isfuture(waiter)
            other = asyncio.ensure_future(await_it(waiter))
            await asyncio.sleep(0)
            assert not other.done()  # waiting on it, as on a future
            gate.set()
            got = await task
            result = waiter.result()
            assert await other is result
            assert await waiter is result  # done: answers at once
            assert await asyncio.ensure_future(waiter) is result
        async with stalled_get(memcached_1[0]) as (task, waiter, gate):
            other = asyncio.ensure_future(await_it(waiter))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await other
            with pytest.raises(asyncio.CancelledError):
                await task
        return got

    assert run(work) == b"v"


def test_throw_checks_its_arguments_as_a_coroutine(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    flush(memcached_1)
    twin = AsyncCluster([memcached_1[0].spec])
    get = StoreCommands.__dict__["get"].plan

    async def work() -> Any:
        await twin.set("w:t", b"v")
        raised = []
        for args in [
            (ValueError, ValueError("x"), "not a traceback"),
            (ValueError("x"), "a value beside an instance"),
        ]:
            awaitable = twin.run(get(twin, "w:t", None))
            with pytest.raises(TypeError) as caught:
                awaitable.throw(*args)
            raised.append(str(caught.value))
            assert await awaitable == b"v"  # still unstarted: it runs as ever
        return raised

    assert run(work, twin) == [
        "throw() third argument must be a traceback object",
        "instance exception may not have a separate value",
    ]
