"""AsyncNamespaces: the namespace API for asyncio, over the same data as the sync one.

The algorithm is the sync one (generated from the same source); these tests
prove the async methods keep its guarantees with real tasks: one request per
read, an invalidation during a compute wins, a soft namespace serves the
invalidated value while one task recomputes, and the sync and async forms read
and write one cache.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.namespaces import AsyncNamespace, AsyncNamespaces, Namespaces
from tests.core.asyncio_tools import Computes, Ticker, loop_never_blocks, run
from tests.fakes import CountingStore


def spaces() -> tuple[Namespaces, AsyncNamespaces, MemoryStore]:
    sync = MemoryStore()
    return Namespaces(sync), AsyncNamespaces(AsyncMemoryStore(sync)), sync


def test_reads_and_writes_of_both_forms_meet() -> None:
    sync_spaces, async_spaces, _ = spaces()
    sync_ns = sync_spaces.namespace("user", 42)
    ns = async_spaces.namespace("user", 42)
    sync_ns.set("name", "ada")

    async def scenario() -> dict[str, Any]:
        got = {
            "get": await ns.get("name"),
            "miss": await ns.get("other", "dflt"),
            "add existing": await ns.add("name", "bob"),
            "add new": await ns.add("mail", "ada@example.com"),
            "set": await ns.set("city", "London"),
            "set_many": await ns.set_many({"a": 1, "b": 2}),
        }
        got["get_many"] = await ns.get_many(["name", "mail", "city", "a", "b", "none"])
        got["delete"] = await ns.delete("a")
        await ns.delete_many(["b"])
        got["after delete"] = await ns.get_many(["a", "b"])
        got["versions"] = await ns.versions()
        return got

    got = run(scenario)
    assert got["get"] == "ada"
    assert got["miss"] == "dflt"
    assert got["add existing"] is False
    assert got["add new"] is True
    assert got["set"] is True
    assert got["set_many"] == []
    assert got["get_many"] == {
        "name": "ada",
        "mail": "ada@example.com",
        "city": "London",
        "a": 1,
        "b": 2,
    }
    assert got["delete"] is True
    assert got["after delete"] == {}
    assert got["versions"] == sync_ns.versions()
    assert sync_ns.get("city") == "London"  # written by the async form, read by the sync one


def test_invalidate_misses_every_older_value_in_both_forms() -> None:
    sync_spaces, async_spaces, _ = spaces()
    sync_ns = sync_spaces.namespace("org", 1)

    async def scenario() -> tuple[Any, Any, Any]:
        ns = async_spaces.namespace("org", 1)
        inner = ns.namespace("user", 7)
        await ns.set("k", "v")
        await inner.set("k", "inner")
        before = await inner.get("k")
        await ns.invalidate()
        return before, await ns.get("k"), await inner.get("k")

    before, outer, inner = run(scenario)
    assert before == "inner"
    assert outer is None
    assert inner is None  # invalidating the outer namespace reaches the nested one
    assert sync_ns.get("k") is None
    assert isinstance(async_spaces.namespace("org", 1).namespace("x"), AsyncNamespace)


def test_a_namespaced_read_is_one_request() -> None:
    sync = MemoryStore()
    counting = CountingStore(sync)
    async_spaces = AsyncNamespaces(AsyncMemoryStore(counting))  # type: ignore[arg-type]
    Namespaces(sync).namespace("user", 1).set_many({"a": 1, "b": 2})

    async def scenario() -> Any:
        ns = async_spaces.namespace("user", 1)
        counting.reset()
        found = await ns.get_many(["a", "b"])
        await ns.get("a")
        return found

    assert run(scenario) == {"a": 1, "b": 2}
    assert counting.calls == {"get_many": 2}  # versions and values together, per read


def test_get_or_compute_computes_once_for_50_tasks_without_stalling_the_loop() -> None:
    _, async_spaces, _ = spaces()

    async def scenario() -> None:
        ns = async_spaces.namespace("report", 1)
        async with Ticker() as ticker:
            # The compute ends after 50 turns of another task: the loop ran all along.
            compute = Computes("v1", until=lambda: ticker.reached(50))
            values = await asyncio.gather(
                *(ns.get_or_compute("total", compute, 60) for _ in range(50))
            )
        assert values == ["v1"] * 50
        assert compute.calls == 1

    with loop_never_blocks():
        run(scenario)


def test_an_invalidation_during_the_compute_wins() -> None:
    _, async_spaces, _ = spaces()
    ns = async_spaces.namespace("report", "during")

    async def compute() -> str:
        await asyncio.sleep(0.01)
        await async_spaces.namespace("report", "during").invalidate()  # another task, meanwhile
        return "old data"

    async def scenario() -> tuple[Any, Any, Any]:
        returned = await ns.get_or_compute("total", compute, 60)
        return (
            returned,
            await ns.get("total"),
            await ns.get_or_compute("total", Computes("new"), 60),
        )

    returned, read, recomputed = run(scenario)
    assert returned == "old data"  # the caller gets what it computed
    assert read is None  # but it was stored already invalid
    assert recomputed == "new"


def test_a_soft_namespace_serves_the_invalidated_value_while_one_task_recomputes() -> None:
    _, async_spaces, _ = spaces()
    fresh = Computes("new", seconds=0.05)

    async def scenario() -> tuple[list[Any], Any]:
        ns = async_spaces.namespace("page", soft=True)
        await ns.get_or_compute("home", Computes("old"), 60)
        await ns.invalidate()
        values = await asyncio.gather(*(ns.get_or_compute("home", fresh, 60) for _ in range(20)))
        return values, await ns.get_or_compute("home", fresh, 60)

    values, after = run(scenario)
    assert sorted(values) == ["new"] + ["old"] * 19
    assert fresh.calls == 1
    assert after == "new"


def test_get_or_set_and_recompute() -> None:
    sync_spaces, async_spaces, _ = spaces()

    async def scenario() -> tuple[Any, Any, Any, Any]:
        ns = async_spaces.namespace("conf")
        first = await ns.get_or_set("a", Computes("computed"), 60)  # a coroutine function
        second = await ns.get_or_set("a", lambda: "ignored", 60)
        plain = await ns.get_or_set("b", lambda: "plain", 60)  # through sync_to_async
        recomputed = await ns.recompute("c", Computes("now"), 60)
        return first, second, plain, recomputed

    assert run(scenario) == ("computed", "computed", "plain", "now")
    assert sync_spaces.namespace("conf").get_or_compute("c", lambda: "not this", 60) == "now"


def test_invalidate_by_parts() -> None:
    _, async_spaces, _ = spaces()

    async def scenario() -> tuple[Any, Any]:
        ns = async_spaces.namespace("user", 5)
        await ns.set("k", 1)
        await async_spaces.invalidate("user", 5)
        gone = await ns.get("k")
        await ns.set("k", 2)
        await ns.invalidate_namespace("inner")  # a nested one: the outer value stays
        return gone, await ns.get("k")

    assert run(scenario) == (None, 2)
