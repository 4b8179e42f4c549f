"""Routing is data: a namespace's commands all reach its root version key's server.

Counted on the wire: one proxy in front of each of three real memcached
servers records what each server was sent, so a command routed by the wrong
bytes shows up on another proxy.  And a :class:`Routed` key cannot lose its
route by conversion: it is not bytes, so every conversion raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.keys import Routed, key_bytes, placed
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import Namespace, Namespaces
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.sets import AppendLists, AppendSets
from django_mcpatterns.core.stampede import lock_key
from tests.conftest import flush
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer


@pytest.fixture(scope="module")
def proxies(memcached_3: list[MemcachedServer]) -> Iterator[list[Proxy]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(Proxy(server.port)) for server in memcached_3]


@pytest.fixture(scope="module")
def cluster(proxies: list[Proxy]) -> Cluster:
    return Cluster([proxy.spec for proxy in proxies], ClusterOptions(timeout=2.0))


def _computed() -> str:
    return "computed"


# Every namespaced operation, as (name, call): each runs on a namespace and its keys.
OPERATIONS: list[tuple[str, Callable[[Namespace, list[str]], Any]]] = [
    ("get", lambda ns, keys: ns.get(keys[0])),
    ("set", lambda ns, keys: ns.set(keys[0], "v")),
    ("add", lambda ns, keys: ns.add(keys[0], "v")),
    ("delete", lambda ns, keys: ns.delete(keys[0])),
    ("get_many", lambda ns, keys: ns.get_many(keys)),
    ("set_many", lambda ns, keys: ns.set_many(dict.fromkeys(keys, "v"))),
    ("delete_many", lambda ns, keys: ns.delete_many(keys)),
    ("get_or_set", lambda ns, keys: ns.get_or_set(keys[0], _computed)),
    # Cold: the recompute lock is taken (add), the value stored, the lock released.
    ("get_or_compute", lambda ns, keys: ns.get_or_compute(keys[0], _computed, 60)),
    ("recompute", lambda ns, keys: ns.recompute(keys[0], _computed, 60)),
    ("invalidate", lambda ns, keys: ns.invalidate()),  # incr of the innermost version key
]

parts = st.lists(st.one_of(st.text(max_size=8), st.integers()), min_size=1, max_size=2)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.lists(parts, min_size=1, max_size=3),
    keys=st.lists(
        st.text(st.characters(exclude_categories=("C", "Z")), min_size=1, max_size=12),
        min_size=1,
        max_size=6,
        unique=True,
    ),
)
def test_every_namespaced_operation_lands_on_the_root_version_keys_server(
    cluster: Cluster,
    proxies: list[Proxy],
    memcached_3: list[MemcachedServer],
    path: list[list[str | int]],
    keys: list[str],
) -> None:
    ns = Namespaces(cluster).namespace(*path[0])
    for level in path[1:]:
        ns = ns.namespace(*level)
    root_version_key = Namespaces(cluster).namespace(*path[0])._version_keys[0]
    home = cluster.ring.get_node(placed(root_version_key)[0])  # where any ketama client puts it
    for name, run in OPERATIONS:
        flush(memcached_3)
        for state in ("cold", "warm"):  # nothing stored yet, then what the first run left
            for proxy in proxies:
                proxy.forget()
            run(ns, keys)
            reached = [proxy.spec for proxy in proxies if any(proxy.sent())]
            assert reached == [home], f"{name} ({state})"


def test_a_routed_keys_stampede_lock_and_lock_live_on_its_route(
    cluster: Cluster, proxies: list[Proxy], memcached_3: list[MemcachedServer]
) -> None:
    flush(memcached_3)
    home = cluster.ring.get_node(b"user:1")
    # A key, and a lock key derived from its bytes, that route to another server on their own.
    elsewhere = next(
        k
        for k in (b"k%d" % i for i in range(99))
        if home not in (cluster.ring.get_node(k), cluster.ring.get_node(k + b":stampede-lock"))
    )
    routed = Routed(elsewhere, b"user:1")
    assert lock_key(routed) == Routed(elsewhere + b":stampede-lock", b"user:1")
    for proxy in proxies:
        proxy.forget()
    lock = Lock(cluster, lock_key(routed), timeout=10)
    assert lock.acquire(blocking=False)
    lock.release()
    assert [proxy.spec for proxy in proxies if any(proxy.sent())] == [home]


# -- a route cannot be lost ------------------------------------------------------------

ROUTED = Routed(b"ns:user:1|profile", b"ns:user:1")


@pytest.mark.parametrize(
    "conversion",
    [
        bytes,
        lambda key: key + b":suffix",
        lambda key: b"prefix:" + key,
        lambda key: key[:10],
        lambda key: key.decode(),
        lambda key: key.startswith(b"ns:"),
        key_bytes,
    ],
    ids=["bytes()", "key + bytes", "bytes + key", "slice", "decode", "startswith", "key_bytes"],
)
def test_a_routed_key_is_not_bytes_so_no_conversion_drops_its_route(
    conversion: Callable[[Any], Any],
) -> None:
    with pytest.raises((TypeError, AttributeError)):
        conversion(ROUTED)


def test_a_routed_key_is_data_that_places_a_command() -> None:
    assert placed(ROUTED) == (b"ns:user:1|profile", b"ns:user:1")
    assert placed("ns:user:1|profile") == (b"ns:user:1|profile", b"ns:user:1|profile")
    with pytest.raises(TypeError):
        Routed("ns:user:1|profile", b"ns:user:1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Routed(ROUTED, b"elsewhere")  # type: ignore[arg-type]


def test_the_embedded_store_accepts_routed_keys_and_ignores_the_route() -> None:
    store = MemoryStore()
    assert store.set(ROUTED, "v")
    assert store.get(ROUTED) == "v"
    assert store.get(b"ns:user:1|profile") == "v"  # one place: the route changes nothing
    assert store.get_many([ROUTED]) == {ROUTED: "v"}  # answers name keys as given


def test_sets_and_lists_refuse_a_routed_key_instead_of_routing_it_elsewhere() -> None:
    # Their shard and item keys derive from the key's bytes: they take plain keys only.
    store = MemoryStore()
    with pytest.raises(TypeError):
        AppendSets(store).sadd(ROUTED, "a")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AppendLists(store).rpush(ROUTED, "a")  # type: ignore[arg-type]
