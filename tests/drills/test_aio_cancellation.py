"""Cancellation drill: tasks cancelled at random points never leave a connection out of step.

Rounds of concurrent reads and writes, each task cancelled at a random point
(after a random number of loop iterations, or by a random ``wait_for``
deadline) or left alone, against three real servers, directly and through
proxies that hold every reply back a little (so cancellations land while
replies are on their way).  After every round each key is read back, by the
same event loop's connections and by an independent sync client: every answer
is that key's own value (the latest completed write, or the write a
cancellation left unknown), never another request's reply.  No cancellation
ever costs a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import PATIENCE, MemcachedServer

ROUNDS = 25
TASKS = 40
KEYS = [f"cancel:{i}" for i in range(TASKS)]


@pytest.fixture(params=[0.0, 0.002], ids=["direct", "delayed"])
def proxies(
    request: pytest.FixtureRequest, memcached_3: list[MemcachedServer]
) -> Iterator[list[Proxy]]:
    flush(memcached_3)
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(Proxy(server.port)) for server in memcached_3]
        for proxy in proxies:
            proxy.delay = request.param
        yield proxies


def value(key: str, generation: int) -> dict[str, Any]:
    return {"key": key, "generation": generation, "pad": "x" * (generation * 97 % 3000)}


async def cancel_somewhere(rng: random.Random, work: Any) -> tuple[bool, Any]:
    """Run ``work`` and cancel it at a random point; (finished, result)."""
    how = rng.random()
    if how < 0.25:
        return True, await work
    if how < 0.6:
        task = asyncio.ensure_future(work)
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        task.cancel()
        try:
            return True, await task
        except asyncio.CancelledError:
            return False, None
    try:
        return True, await asyncio.wait_for(work, rng.uniform(0, 0.004))
    except TimeoutError:
        return False, None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cancellations_at_random_points_leave_every_reply_to_its_request(
    proxies: list[Proxy], memcached_3: list[MemcachedServer], seed: int
) -> None:
    rng = random.Random(seed)
    # Timeouts far past any answer: a timeout is no cancellation, and on a busy machine the
    # in-process proxies' delayed replies took over 2 s.  The connect too: the loop's connect
    # is bounded by the loop's clock, and a loop held up past it gives up on a made connection.
    options = ClusterOptions(timeout=PATIENCE, connect_timeout=PATIENCE)
    twin = AsyncCluster([p.spec for p in proxies], options)
    sync = Cluster([p.spec for p in proxies], options)
    # What each key may hold: the generations written and not known to have failed.
    possible: dict[str, set[int | None]] = {key: {None} for key in KEYS}

    async def drill() -> None:
        await twin.get_many(KEYS)  # every channel open
        for generation in range(ROUNDS):
            operations = []
            for i, key in enumerate(KEYS):
                kind = rng.choice(["set", "get", "get_many", "gets", "set_many"])
                if kind == "set":
                    operations.append((key, twin.set(key, value(key, generation))))
                elif kind == "set_many":
                    operations.append((key, twin.set_many({key: value(key, generation)})))
                elif kind == "get":
                    operations.append((None, twin.get(key)))
                elif kind == "gets":
                    operations.append((None, twin.gets(key)))
                else:
                    operations.append((None, twin.get_many([key, KEYS[(i + 1) % TASKS]])))
            results = await asyncio.gather(*[cancel_somewhere(rng, work) for _, work in operations])
            for (written, _), (finished, result) in zip(operations, results, strict=True):
                if written is None:
                    continue
                if finished and result in (True, []):
                    possible[written] = {generation}  # stored: the latest completed write
                else:
                    possible[written].add(generation)  # cancelled: landed or not
            # A cancelled request may still be on its way (its outcome unknown, so a read
            # overlapping it may see either value); stats queue behind all of them.
            await twin.stats()
            # Read back through the same connections, all at once...
            found = await asyncio.gather(*[twin.get(key) for key in KEYS])
            many = await twin.get_many(KEYS)
            for key, item in zip(KEYS, found, strict=True):
                generation_found = None if item is None else item["generation"]
                assert item is None or item == value(key, item["generation"])
                assert generation_found in possible[key], (key, generation_found, possible[key])
                assert many.get(key) == item
                possible[key] = {generation_found}  # settled: what memcached holds
            # ...and through a client of its own: the same answers.
            assert sync.get_many(KEYS) == many

    asyncio.run(drill())
    # One connection per server for the loop, one for the sync client: no cancellation cost one.
    # Should one fail, what each connection carried (its first command, bytes each way)
    # tells a replaced connection (a timeout, a cut) from a probe or an epoch read.
    carried = [
        [(bytes(c.sent[:12]), len(c.sent), len(c.received)) for c in p.connections] for p in proxies
    ]
    assert [len(p.connections) for p in proxies] == [2, 2, 2], carried
    sync.close()
