"""core/loops.py: cleanups run as a loop shuts down, once per key; closed loops are forgotten."""

from __future__ import annotations

import asyncio

from django_mcpatterns.core import loops


def test_cleanups_run_awaited_as_asyncio_run_shuts_the_loop_down() -> None:
    ran: list[str] = []

    async def close_connections() -> None:
        await asyncio.sleep(0)  # the loop still runs
        ran.append("awaited")

    async def main() -> None:
        await loops.at_shutdown("a", close_connections)
        await loops.at_shutdown("a", close_connections)  # one per key
        await loops.at_shutdown("b", lambda: ran.append("plain"))
        assert ran == []

    asyncio.run(main())
    assert sorted(ran) == ["awaited", "plain"]
    assert not loops._watchers  # the loop is forgotten once done


def test_a_loop_closed_without_shutting_down_is_forgotten_by_the_next() -> None:
    ran: list[str] = []
    loop = asyncio.new_event_loop()
    loop.run_until_complete(loops.at_shutdown("x", lambda: ran.append("x")))
    loop.close()  # no shutdown_asyncgens(): nothing runs
    assert loop in loops._watchers

    async def main() -> None:
        await loops.at_shutdown("y", lambda: ran.append("y"))

    asyncio.run(main())
    assert ran == ["y"]
    assert loop not in loops._watchers
