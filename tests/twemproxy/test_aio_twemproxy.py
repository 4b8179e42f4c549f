"""AsyncCluster through twemproxy (a real nutcracker): text mode works, batches included,
and meta mode gets the same one clear error as Cluster, the proxy staying healthy."""

from __future__ import annotations

import asyncio

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.exceptions import CommandNotSupportedError
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import Nutcracker
from tests.twemproxy.test_protocol_option import meta_refused


def test_text_mode_through_twemproxy_batches_and_pipelines(nutcracker: Nutcracker) -> None:
    nutcracker.flush()
    twin = AsyncCluster([nutcracker.spec], ClusterOptions(protocol="text"))

    async def work() -> None:
        assert await twin.set_many({f"k{i}": i for i in range(40)}) == []
        assert await asyncio.gather(*[twin.get(f"k{i}") for i in range(40)]) == list(range(40))
        assert await twin.get_many(["k1", "k2", "none"]) == {"k1": 1, "k2": 2}
        token = await twin.add_cas("owned", b"me", 60)
        assert token is not None
        assert await twin.delete_cas("owned", token) is True
        with pytest.raises(CommandNotSupportedError, match="does not support flush_all"):
            await twin.flush_all()
        assert await twin.stats() == {}
        await twin.close()

    asyncio.run(work())
    assert twin.health()[nutcracker.spec].failures == 0


def test_meta_mode_through_twemproxy_raises_one_error_naming_the_option(
    nutcracker: Nutcracker,
) -> None:
    nutcracker.flush()
    twin = AsyncCluster([nutcracker.spec], ClusterOptions(raise_errors=True))

    async def work() -> None:
        assert await twin.set("k", 1)
        with pytest.raises(CommandNotSupportedError) as raised:
            await twin.ttl("k")
        assert str(raised.value) == meta_refused(nutcracker.spec, "closed the connection on")
        assert await twin.get("k") == 1  # the next command works on a new connection
        await twin.close()

    asyncio.run(work())
    assert twin.health()[nutcracker.spec].failures == 0
