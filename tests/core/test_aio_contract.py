"""The Store contract suite, run on AsyncCluster: it answers exactly as Cluster and memcached.

Each coroutine runs on one persistent event loop through :class:`tests.aio.Blocking`,
in both protocols, on one and on three servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.store import AsyncStore
from tests.aio import Blocking
from tests.conftest import flush
from tests.core import test_store_contract as contract
from tests.harness import MemcachedServer

SERVER_FIXTURES = {
    "aio-1": "memcached_1",
    "aio-3": "memcached_3",
    "aio-3-text": "memcached_3",
}
PROTOCOLS = {"aio-3-text": "text"}


class TestAsyncClusterContract(contract.TestStoreContract):
    @pytest.fixture(params=list(SERVER_FIXTURES))
    def store(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        servers = request.getfixturevalue(SERVER_FIXTURES[request.param])
        flush(servers)
        protocol = PROTOCOLS.get(request.param, "meta")
        adapter = Blocking(
            AsyncCluster([s.spec for s in servers], ClusterOptions(protocol=protocol))
        )
        yield adapter
        adapter.shutdown()

    def test_is_a_store(self, store: Any) -> None:
        # The adapter answers as a Store through __getattr__, which isinstance no longer
        # consults from Python 3.12 on (inspect.getattr_static): the claim is the cluster's.
        assert isinstance(store.store, AsyncStore)

    @pytest.fixture
    def servers(self, request: pytest.FixtureRequest, store: Any) -> list[MemcachedServer]:
        fixture = SERVER_FIXTURES[request.node.callspec.params["store"]]
        servers: list[MemcachedServer] = request.getfixturevalue(fixture)
        return servers

    @pytest.fixture
    def protocol(self, request: pytest.FixtureRequest, store: Any) -> str:
        return PROTOCOLS.get(request.node.callspec.params["store"], "meta")

    @pytest.fixture(params=["meta", "text"])
    def protocol_store(
        self,
        request: pytest.FixtureRequest,
        store: Any,
        servers: list[MemcachedServer],
        protocol: str,
    ) -> Iterator[Any]:
        if protocol == "text":
            pytest.skip("a text store: covered by the text case of every other store")
        if request.param == "meta":
            yield store
            return
        adapter = Blocking(
            AsyncCluster([server.spec for server in servers], ClusterOptions(protocol="text"))
        )
        yield adapter
        adapter.shutdown()
