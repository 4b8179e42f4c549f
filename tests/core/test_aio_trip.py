"""The compiled async get (``src/speedups/trip.c``) answers as the coroutine ``_trip`` does.

Each test runs twice in one process: on the compiled path (``AsyncCluster.run`` hands a
healthy server's get to the C awaitable) and with that awaitable switched off (the
coroutine ``_trip``, the pure path's).  Both must give the same answers: values of every
format, misses, an item its flags misdescribe, a key the C placement leaves to Python;
tasks cancelled while their batch is on the wire; a connection lost mid-batch (the
default view's ``default``, the strict view's unknown outcome).  The compiled pieces
around it (a key's bytes, a plain value's decoding) are compared with their Python
twins on generated input.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymemcache.serde import FLAG_BYTES, FLAG_INTEGER, FLAG_TEXT

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.client import aio
from django_mcpatterns.core.exceptions import OutcomeUnknownError
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.keys import placed as placed_in_python
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.protocol import compiled
from django_mcpatterns.core.protocol.commands import StoreCommands
from django_mcpatterns.core.protocol.decoding import Decoders
from django_mcpatterns.core.protocol.plans import MISS
from django_mcpatterns.core.values.serde import SerdeOptions
from django_mcpatterns.core.wire import ErrorReply, Value
from tests.conftest import flush
from tests.core.asyncio_tools import run_on_movable_clock, time_out_withheld
from tests.drills.proxy import Proxy
from tests.harness import PATIENCE, MemcachedServer, raw_client

needs_compiled = pytest.mark.skipif(
    compiled.speedups is None, reason=f"the compiled path is not built: {compiled.why_pure}"
)


@pytest.fixture(params=["compiled", "coroutine"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The compiled awaitable, or the coroutine ``_trip`` (the pure path's)."""
    if request.param == "compiled":
        if aio.trip is None:
            pytest.skip(f"the compiled path is not built: {compiled.why_pure}")
    else:
        monkeypatch.setattr(aio, "trip", None)
        monkeypatch.setattr(AsyncCluster, "run", aio.run_in_python)
    return str(request.param)


def run(work: Callable[[], Awaitable[Any]], *clusters: AsyncCluster, clock: bool = False) -> Any:
    """``work()`` in a loop of its own; the clusters' connections closed after it.

    With ``clock``, the loop is a :class:`~tests.core.asyncio_tools.MovableClockLoop`
    (the test ends timeouts).
    """

    async def main() -> Any:
        try:
            return await work()
        finally:
            for cluster in clusters:
                await cluster.close()
            await asyncio.sleep(0)  # the transports' closing callbacks

    return run_on_movable_clock(main) if clock else asyncio.run(main())


# -- answers -----------------------------------------------------------------------------

STORED: dict[Any, Any] = {
    "t:bytes": b"\x00raw\r\n",
    "t:text": "héllo",
    "t:int": 12,
    "t:big": 2**70,
    "t:dict": {"a": [1, 2]},
    "t:empty": b"",
    "t:é": "a key the C placement leaves to Python",
    Routed(b"t:routed", b"elsewhere"): "routed",
}


def test_gets_answer_alike_on_both_paths(memcached_1: list[MemcachedServer], path: str) -> None:
    flush(memcached_1)
    raw = raw_client(memcached_1[0])
    raw.set("t:liar", b"not a number", flags=FLAG_INTEGER)  # its flags misdescribe it
    raw.set("t:latin", b"\xff\xfe", flags=FLAG_TEXT)
    raw.set("t:plain", b"as it is", flags=FLAG_BYTES)
    twin = AsyncCluster([memcached_1[0].spec])

    async def work() -> Any:
        await twin.set_many(STORED)
        keys = [*STORED, "t:liar", "t:latin", "t:plain", "t:missing"]
        one_by_one = [await twin.get(key) for key in keys]
        together = await asyncio.gather(*(twin.get(key, "default") for key in keys))
        tokens = [(await twin.gets(key))[0] for key in keys]
        return one_by_one, together, tokens

    one_by_one, together, tokens = run(work, twin)
    expected = [*STORED.values(), None, None, b"as it is", None]
    assert one_by_one == expected  # a refused item is a miss, left in place
    assert together == ["default" if v is None else v for v in expected]  # a miss's default
    assert tokens == expected
    assert raw.get("t:liar") == b"not a number"
    raw.close()


def test_the_awaitable_is_a_coroutine_to_asyncio(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    flush(memcached_1)
    twin = AsyncCluster([memcached_1[0].spec])
    get = StoreCommands.__dict__["get"].plan  # the command's plan, as the method makes it

    async def work() -> Any:
        await twin.set("t:task", b"v")
        awaitable = twin.run(get(twin, "t:task", None))
        assert asyncio.iscoroutine(awaitable)
        assert (type(awaitable).__name__ == "Trip") == (path == "compiled")
        first = await asyncio.create_task(awaitable)  # a task runs it as a coroutine
        unstarted = twin.run(get(twin, "t:task", None))
        with pytest.raises(KeyError):
            unstarted.throw(KeyError("thrown before the first step"))
        with pytest.raises(RuntimeError):
            await unstarted  # finished by the throw, as a coroutine is
        closed = twin.run(get(twin, "t:task", None))
        closed.close()
        return first, await twin.get("t:task")

    assert run(work, twin) == (b"v", b"v")


# -- cancellation --------------------------------------------------------------------------


def test_tasks_cancelled_mid_batch_leave_the_batch_and_the_connection(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    flush(memcached_1)
    keys = [f"t:c{i}" for i in range(50)]
    with Proxy(memcached_1[0].port) as proxy:
        proxy.delay = 0.002  # replies on their way while tasks are cancelled
        twin = AsyncCluster([proxy.spec])

        async def work() -> Any:
            await twin.set_many({key: key.encode() for key in keys})
            tasks = [asyncio.ensure_future(twin.get(key)) for key in keys]
            await asyncio.sleep(0)  # every get queued...
            await asyncio.sleep(0)  # ...and the batch written
            for task in tasks[::3]:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            again = await asyncio.gather(*(twin.get(key) for key in keys))
            return outcomes, again

        outcomes, again = run(work, twin)
        assert len(proxy.connections) == 1  # no cancellation cost the connection
    for i, (key, outcome) in enumerate(zip(keys, outcomes, strict=True)):
        if i % 3:
            assert outcome == key.encode()  # its own reply, whoever else gave up
        else:
            assert isinstance(outcome, asyncio.CancelledError) or outcome == key.encode()
    assert any(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes[::3])
    assert again == [key.encode() for key in keys]


def test_a_connection_lost_mid_batch_degrades_or_is_unknown(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    flush(memcached_1)
    with Proxy(memcached_1[0].port) as proxy:
        # Patient: a loaded machine answers every request that is not withheld; the withheld
        # ones time out when the test moves the loop's clock, once memcached answered them.
        options = ClusterOptions(timeout=PATIENCE, connect_timeout=PATIENCE, retry_timeout=0)
        twin = AsyncCluster([proxy.spec], options)

        async def work() -> Any:
            await twin.set("t:lost", b"v")
            proxy.withhold(b"get ")
            degrading = asyncio.ensure_future(twin.get("t:lost", "default"))
            await time_out_withheld(proxy, PATIENCE)  # the reply never comes: timed out
            degraded = await degrading
            proxy.withhold(b"get ")
            unknown = asyncio.ensure_future(twin.strict().get("t:lost"))
            await time_out_withheld(proxy, PATIENCE)
            with pytest.raises(OutcomeUnknownError):
                await unknown
            return degraded, await twin.get("t:lost")

        assert run(work, twin, clock=True) == ("default", b"v")


def test_each_task_wakes_in_its_own_context_and_timeouts_cancel(
    memcached_1: list[MemcachedServer], path: str
) -> None:
    """A batch's tasks are woken together (one loop callback on the compiled path), each in
    its own context; a timeout around a get cancels it as it cancels any await."""
    flush(memcached_1)
    mine: contextvars.ContextVar[int] = contextvars.ContextVar("mine")
    twin = AsyncCluster([memcached_1[0].spec])

    async def one(i: int) -> tuple[int, Any]:
        mine.set(i)
        found = await twin.get(f"t:ctx{i % 7}")
        return mine.get(), found

    async def work() -> Any:
        await twin.set_many({f"t:ctx{i}": i for i in range(7)})
        seen = await asyncio.gather(*(one(i) for i in range(50)))
        with Proxy(memcached_1[0].port) as proxy:
            proxy.delay = 0.5  # the reply comes long after the deadline
            slow = AsyncCluster([proxy.spec], ClusterOptions(timeout=5))
            await slow.set("t:ctx0", 0)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(slow.get("t:ctx0"), 0.05)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await slow.get("t:ctx0")
            after = await slow.get("t:ctx0")  # the connection is still in step
            await slow.close()
        return seen, after

    seen, after = run(work, twin)
    assert seen == [(i, i % 7) for i in range(50)]
    assert after == 0


# -- the compiled pieces against their Python twins ------------------------------------------

any_key = st.one_of(
    st.text(max_size=260),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7F), min_size=0, max_size=9),
    st.binary(max_size=260),
    st.sampled_from([Routed(b"k", b"r"), 3, None, "a b", "\x7f", "x" * 251]),
)


def outcome(make: Callable[[], Any]) -> Any:
    try:
        return ("ok", make())
    except Exception as exc:
        return ("raised", type(exc), str(exc))


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(key=any_key)
def test_placed_answers_as_keys_placed(key: Any) -> None:
    assert outcome(lambda: compiled.placed(key)) == outcome(lambda: placed_in_python(key))


replies = st.one_of(
    st.lists(
        st.builds(
            Value,
            st.just(b"k"),
            st.sampled_from([0, 1, 2, 4, 8, 16, 3, 99]),
            st.one_of(st.binary(max_size=8), st.sampled_from([b"12", b"-3", b"\xff", b"1 "])),
        ),
        max_size=2,
    ),
    st.sampled_from([ErrorReply("ERROR", ""), ErrorReply("SERVER_ERROR", "out of memory")]),
)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(reply=replies, signed=st.booleans())
def test_the_value_decoder_answers_as_decoders_value(reply: Any, signed: bool) -> None:
    options = SerdeOptions(signed=True, signing_key="k" * 32) if signed else SerdeOptions()
    decoders = Decoders(options.build(None))
    assert compiled.speedups is not None
    assert type(decoders.value) is compiled.speedups.ValueDecoder
    assert repr(outcome(lambda: decoders.value(reply))) == repr(
        outcome(lambda: decoders._value(reply))
    )
    if reply == []:
        assert decoders.value(reply) is MISS
