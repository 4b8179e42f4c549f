"""Namespaces: key derivation, routing and costs on the servers (what does not depend on the form).

Key derivation is pure; routing and request counts are measured on the servers:
which server holds each key, what memcached's ``stats`` counted, how many
requests the client sent.  The behaviour suite (versions, invalidation, nesting,
soft invalidation, computes), on the embedded store and on a 3-server cluster, is
written once for both forms in ``tests/core/patterns/_async/test_namespaces.py``
(its sync form generated beside it).  Concurrent processes are in
``test_namespaces_processes.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.envelope import Envelope
from django_mcpatterns.core.exceptions import (
    EncodingError,
    InvalidKeyError,
    NodeUnavailableError,
)
from django_mcpatterns.core.keys import Routed, placed
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import (
    MAX_READABLE_ID,
    REMEMBERED_PATHS,
    Namespace,
    Namespaces,
    namespace_id,
    part_text,
)
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.core.test_cluster import SocketSpy
from tests.harness import LOOPBACK, MemcachedServer, free_port, raw_client, servers_holding

# A long Django-like prefix: KEY_PREFIX "site-with-a-long-prefix", VERSION 12.
PREFIX = "site-with-a-long-prefix-" + "x" * 40 + ":12:"

parts_st = st.lists(
    st.one_of(st.text(max_size=80), st.integers(-(2**70), 2**70)), min_size=1, max_size=4
)
path_st = st.lists(parts_st, min_size=1, max_size=3)


def prefixed(key: str, version: Any) -> str:
    return f"{PREFIX}{key}" if version is None else f"{PREFIX}{version}:{key}"


def nested(spaces: Namespaces, path: list[list[Any]]) -> Namespace:
    ns = spaces.namespace(*path[0])
    for parts in path[1:]:
        ns = ns.namespace(*parts)
    return ns


# -- key derivation ------------------------------------------------------------------


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(path=path_st, key=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20))
def test_any_parts_make_valid_keys_after_the_backends_prefix(path: list[list[Any]], key: str):
    spaces = Namespaces(MemoryStore(), make_key=prefixed)
    ns = nested(spaces, path)
    for version_key in ns._version_keys:
        assert placed(version_key) == (version_key.key, ns._version_keys[0].key)
    made = ns.key(key or "k")
    assert placed(made)[0] == made.key  # no whitespace, no control bytes, <= 250 bytes
    assert made.key.startswith(PREFIX.encode() + b"ns:")
    assert len(ns._id) <= MAX_READABLE_ID + 1


@settings(max_examples=300)
@given(a=path_st, b=path_st)
def test_distinct_namespaces_never_share_a_key(a: list[list[Any]], b: list[list[Any]]):
    texts = [tuple(tuple(part_text(p) for p in parts) for parts in path) for path in (a, b)]
    same = texts[0] == texts[1]
    assert (namespace_id(texts[0]) == namespace_id(texts[1])) == same
    for path in texts:
        readable = namespace_id(path)
        if not readable.startswith("#"):  # the readable form decodes back: it is injective
            decoded = tuple(
                tuple(unquote(part, errors="surrogatepass") for part in level.split(":"))
                for level in readable.split("/")
            )
            assert decoded == path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ((("user", "42"),), "user:42"),
        ((("org", "1"), ("user", "42")), "org:1/user:42"),
        ((("a:b",),), "a%3Ab"),  # never the two parts ("a", "b")
        ((("a", "b"),), "a:b"),
        ((("a/b",),), "a%2Fb"),  # never the two levels a / b
        ((("x|y",),), "x%7Cy"),  # "|" ends the id in value keys
        ((("#1",),), "%231"),  # "#" starts a digest
        ((("new\nline", "tab\t", " "),), "new%0Aline:tab%09:%20"),
        ((("é",),), "%C3%A9"),
        ((("",),), ""),
    ],
)
def test_ids_are_readable_and_unambiguous(path: Any, expected: str) -> None:
    assert namespace_id(path) == expected


def test_long_ids_become_a_digest() -> None:
    long = (("x" * 100,),)
    digest = namespace_id(long)
    assert digest.startswith("#")
    assert len(digest) == 41
    assert digest != namespace_id((("x" * 101,),))


def test_an_int_part_is_its_decimal_text() -> None:
    spaces = Namespaces(MemoryStore())
    assert spaces.namespace("user", 42).key("k") == spaces.namespace("user", "42").key("k")
    assert spaces.namespace(-7).key("k").key == b"ns:-7|k"


@pytest.mark.parametrize("bad", [True, 1.5, None, b"bytes", ("tuple",)])
def test_parts_are_str_or_int_only(bad: Any) -> None:
    with pytest.raises(TypeError):
        Namespaces(MemoryStore()).namespace("user", bad)


def test_a_namespace_needs_a_part() -> None:
    with pytest.raises(ValueError, match="at least one part"):
        Namespaces(MemoryStore()).namespace()


def test_derived_keys_are_remembered_within_a_bound() -> None:
    spaces = Namespaces(MemoryStore())
    first = spaces.namespace("user", 1)
    assert spaces.namespace("user", 1)._version_keys is first._version_keys
    for user in range(REMEMBERED_PATHS + 10):
        spaces.namespace("user", user)
    assert len(spaces._paths) <= REMEMBERED_PATHS
    assert spaces.namespace("user", 1)._version_keys == first._version_keys


def test_user_keys_follow_the_stores_key_rules() -> None:
    ns = Namespaces(MemoryStore()).namespace("user", 42)
    with pytest.raises(InvalidKeyError):
        ns.get("has space")
    with pytest.raises(InvalidKeyError):
        ns.set("k" * 250, 1)


# -- routing and costs on real servers --------------------------------------------------


@pytest.fixture
def servers(memcached_3: list[MemcachedServer]) -> list[MemcachedServer]:
    flush(memcached_3)
    return memcached_3


@pytest.fixture
def spy() -> SocketSpy:
    return SocketSpy()


@pytest.fixture
def cluster(servers: list[MemcachedServer], spy: SocketSpy) -> Iterator[Cluster]:
    cluster = Cluster(
        [s.spec for s in servers], ClusterOptions(client_options={"socket_module": spy})
    )
    yield cluster
    cluster.close()


def stats(servers: list[MemcachedServer], name: str) -> list[int]:
    found = []
    for server in servers:
        client = raw_client(server)
        try:
            found.append(int(client.stats()[name.encode()]))
        finally:
            client.close()
    return found


def delta(before: list[int], after: list[int]) -> list[int]:
    return [b - a for a, b in zip(before, after, strict=True)]


def test_every_key_of_a_namespace_lives_on_its_root_version_keys_server(
    cluster: Cluster, servers: list[MemcachedServer]
) -> None:
    spaces = Namespaces(cluster)
    for user in range(5):
        root = spaces.namespace("user", user)
        inner = root.namespace("posts").namespace("page", 2)
        keys = [f"k{i}" for i in range(4)]
        root.set_many(dict.fromkeys(keys, 1))
        inner.set_many(dict.fromkeys(keys, 2))
        (home,) = servers_holding(servers, root._version_keys[0])
        # The root's version key sits where any ketama client would put it...
        assert home == cluster.ring.get_node(root._version_keys[0].key)
        # ...and everything of the namespace follows it.
        for key in [*inner._version_keys, *(n.key(k) for n in (root, inner) for k in keys)]:
            assert servers_holding(servers, key) == [home]


def test_ordinary_keys_route_on_their_own_bytes(cluster: Cluster, servers: list[MemcachedServer]):
    keys = [f"{{user:{i}}}:profile" for i in range(12)] + [f"user:{i}" for i in range(12)]
    for key in keys:
        cluster.set(key, 1)
        assert servers_holding(servers, key.encode()) == [cluster.ring.get_node(key)]
    home = cluster.ring.get_node(b"user:1")
    elsewhere = next(k for k in (b"k%d" % i for i in range(99)) if cluster.ring.get_node(k) != home)
    cluster.set(Routed(elsewhere, route=b"user:1"), 1)  # only an explicit Routed moves a key
    assert servers_holding(servers, elsewhere) == [home]


def test_a_read_is_one_request_to_one_server(
    cluster: Cluster, servers: list[MemcachedServer], spy: SocketSpy
) -> None:
    spaces = Namespaces(cluster)
    ns = spaces.namespace("org", 1).namespace("user", 42)
    ns.set_many({f"k{i}": i for i in range(10)})
    home = cluster.ring.get_node(ns._version_keys[0].key)
    homes = [s.spec == home for s in servers]
    expectations = [
        (lambda: ns.get("k1"), 3),  # 2 version keys + the value
        (lambda: ns.get_many([f"k{i}" for i in range(10)]), 12),
        (lambda: ns.get_or_set("k2", "unused"), 3),
        (lambda: ns.get_or_compute("c", lambda: 1, 60), None),  # warm it up
        (lambda: ns.get_or_compute("c", lambda: 2, 60), 3),
    ]
    for read, keys in expectations:
        before, sends = stats(servers, "cmd_get"), spy.count("send")
        read()
        if keys is None:
            continue
        assert spy.count("send") - sends == 1
        assert delta(before, stats(servers, "cmd_get")) == [keys if h else 0 for h in homes]


def test_invalidation_is_one_incr_and_a_set_two_requests(
    cluster: Cluster, servers: list[MemcachedServer], spy: SocketSpy
) -> None:
    ns = Namespaces(cluster).namespace("user", 42)
    ns.set("k", 1)
    sends, incrs = spy.count("send"), stats(servers, "incr_hits")
    ns.invalidate()
    assert spy.count("send") - sends == 1
    assert sum(delta(incrs, stats(servers, "incr_hits"))) == 1
    sends, sets = spy.count("send"), stats(servers, "cmd_set")
    ns.set("k", 2)
    assert spy.count("send") - sends == 2  # the versions, then the set
    assert sum(delta(sets, stats(servers, "cmd_set"))) == 1


def test_invalidating_on_an_unreachable_server_raises() -> None:
    options = ClusterOptions(on_outage="raise")
    cluster = Cluster([f"{LOOPBACK}:{free_port()}"], options)  # nobody listens there
    ns = Namespaces(cluster).namespace("user", 42)
    assert ns.get("k") is None  # reads degrade to misses, as every read does
    with pytest.raises(NodeUnavailableError):
        ns.invalidate()


def test_invalidating_on_an_unreachable_server_degrades_and_journals_the_version_key() -> None:
    cluster = Cluster([f"{LOOPBACK}:{free_port()}"])  # nobody listens there
    events: list[object] = []
    ns = Namespaces(cluster, on_event=events.append).namespace("user", 42)
    assert ns.invalidate() == 0  # on_outage="degrade" (the default): nothing raised
    assert [type(event).__name__ for event in events] == ["WriteDegraded"]
    assert cluster.journal() == {cluster.servers[0].node: 1}  # its version key, deleted when back


def test_remap_failover_moves_a_namespace_as_a_whole(
    memcached_4_fresh: list[MemcachedServer],
) -> None:
    servers = memcached_4_fresh
    options = ClusterOptions(failover="remap", retry_attempts=1, retry_timeout=60)
    cluster = Cluster([s.spec for s in servers], options)
    try:
        ns = Namespaces(cluster).namespace("user", 42).namespace("posts")
        home = cluster.ring.get_node(ns._version_keys[0].key)
        next(s for s in servers if s.spec == home).kill()
        ns.get("k")  # the failure that marks the server dead
        ns.set_many({f"k{i}": i for i in range(10)})
        assert ns.get_many([f"k{i}" for i in range(10)]) == {f"k{i}": i for i in range(10)}
        alive = [s for s in servers if s.spec != home]
        (new_home,) = servers_holding(alive, ns._version_keys[0])
        for i in range(10):
            assert servers_holding(alive, ns.key(f"k{i}")) == [new_home]
    finally:
        cluster.close()


def test_a_plain_envelope_is_not_a_namespaced_value() -> None:
    ns = Namespaces(MemoryStore()).namespace("user", 42)
    ns._ctx.store.set(ns.key("k"), Envelope("soft"))
    with pytest.raises(EncodingError):
        ns.get("k")
