"""AsyncNamespaces alone: real tasks, computes of both kinds, and the two forms over one cache.

The behaviour of both forms is tested once, in asyncio, by
``tests/core/patterns/_async/test_namespaces.py`` (its sync form generated beside
it).  Here is what only asyncio has: 50 tasks computing once without stalling the
loop, a soft namespace serving the invalidated value while one task recomputes,
coroutine and plain computes, and the sync and async forms reading and writing one
cache.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django_mcpatterns.core.memory import AsyncMemoryStore, MemoryStore
from django_mcpatterns.core.namespaces import AsyncNamespace, AsyncNamespaces, Namespaces
from tests.core.asyncio_tools import Computes, Ticker, loop_never_blocks, run


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
