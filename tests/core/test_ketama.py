"""Continuum: the ketama ring users rely on to share a cluster with other clients.

Bit-for-bit agreement with the running peers is proven in
``test_ketama_interop.py`` (pylibmc, nutcracker) and by the pinned vectors of
``ketama_golden.py`` (confirmed once against C libketama and Java spymemcached).
Here: the properties consistent hashing promises, the spec's edge cases, errors.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import string
import struct
from bisect import bisect_left
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymemcache.client.base import Client
from pymemcache.client.hash import HashClient

from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.ketama import (
    VARIANTS,
    Continuum,
    fnv1a_64_hash,
    md5_hash,
    one_at_a_time_hash,
)
from tests.core.ketama_golden import GOLDEN, KEYS

# Equal weights keep every server at 40 digests (160 points) up to 24 servers in
# the float32 formula (25 gives 39) and up to 60 in libketama's; libmemcached's
# unweighted one-at-a-time ring always has 100.  Within that range adding or
# removing a server leaves every other server's points where they were.
MAX_STABLE = 20

keys = st.one_of(st.text(min_size=1, max_size=60), st.binary(min_size=1, max_size=250))
text_keys = st.text(min_size=1, max_size=60)
variants = st.sampled_from(VARIANTS)


def random_keys(count: int, seed: int = 7) -> list[str]:
    """Random keys: FNV-1a spreads sequential keys like "user:1", "user:2" unevenly."""
    rng = random.Random(seed)
    return ["".join(rng.choices(string.ascii_letters + string.digits, k=12)) for _ in range(count)]


def node_list(count: int, base: int = 20000) -> list[str]:
    return [f"10.0.{i // 200}.{i % 200 + 1}:{base + i}" for i in range(count)]


node_counts = st.integers(min_value=1, max_value=MAX_STABLE)


# -- lookups ----------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_get_node_returns_the_node_string_as_given(variant):
    nodes = ["cache-a.example", "10.0.0.2:11212", "[::1]:11213", "/run/memcached.sock"]
    ring = Continuum(nodes, variant=variant)
    owners = {ring.get_node(f"key-{i}") for i in range(2000)}
    assert owners == set(nodes)


@given(variant=variants, key=text_keys)
def test_str_keys_route_on_their_utf8_bytes(variant, key):
    ring = Continuum(node_list(5), variant=variant)
    assert ring.get_node(key) == ring.get_node(key.encode("utf-8"))


def test_str_subclasses_and_bytes_likes_route_like_their_bytes():
    class SafeText(str):  # Django hands keys around as str subclasses
        pass

    ring = Continuum(node_list(5))
    expected = ring.get_node(b"user:42")
    assert ring.get_node(SafeText("user:42")) == expected
    assert ring.get_node(bytearray(b"user:42")) == expected
    assert ring.get_node(memoryview(b"user:42")) == expected
    assert ring.get_nodes(SafeText("user:42"), 1) == [expected]
    with pytest.raises(TypeError, match="str or bytes"):
        ring.get_node(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("variant", VARIANTS)
def test_single_server_gets_every_key(variant):
    ring = Continuum(["10.0.0.1:11211"], variant=variant)
    assert {ring.get_node(f"k{i}") for i in range(200)} == {"10.0.0.1:11211"}


# -- pinned vectors (libketama, spymemcached) -----------------------------------


@pytest.mark.parametrize(
    "config", GOLDEN, ids=[f"{c['variant']}-{len(c['nodes'])}-{bool(c['weights'])}" for c in GOLDEN]
)
def test_golden_vectors(config):
    ring = Continuum(config["nodes"], weights=config["weights"], variant=config["variant"])
    expected = [config["nodes"][i] for i in config["expected"]]
    assert [ring.get_node(key) for key in KEYS] == expected


# -- consistent hashing properties ----------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=variants, count=node_counts, sample=st.lists(text_keys, min_size=300, max_size=300))
def test_adding_a_server_moves_keys_only_onto_it(variant, count, sample):
    nodes = node_list(count + 1)
    before = Continuum(nodes[:-1], variant=variant)
    after = Continuum(nodes[:-1], variant=variant)
    after.add_node(nodes[-1])
    moved = [k for k in sample if before.get_node(k) != after.get_node(k)]
    assert all(after.get_node(k) == nodes[-1] for k in moved)
    # About 1/(n+1) of the keyspace moves: the new server's share of the ring.
    share = after.shares()[nodes[-1]]
    assert 0.4 / (count + 1) < share < 1.9 / (count + 1)


@pytest.mark.parametrize("variant", VARIANTS)
def test_adding_a_server_moves_about_one_in_n_plus_one(variant):
    for count in (3, 7, 12):
        nodes = node_list(count + 1)
        before = Continuum(nodes[:-1], variant=variant)
        after = Continuum(nodes, variant=variant)
        sample = random_keys(6000)
        moved = sum(before.get_node(k) != after.get_node(k) for k in sample) / len(sample)
        assert abs(moved - after.shares()[nodes[-1]]) < 0.02
        assert 0.5 / (count + 1) < moved < 1.6 / (count + 1)


@settings(max_examples=40, deadline=None)
@given(
    variant=variants,
    count=st.integers(min_value=2, max_value=MAX_STABLE),
    data=st.data(),
    sample=st.lists(text_keys, min_size=200, max_size=200),
)
def test_removing_a_server_moves_only_its_keys(variant, count, data, sample):
    nodes = node_list(count)
    gone = data.draw(st.sampled_from(nodes))
    ring = Continuum(nodes, variant=variant)
    before = {k: ring.get_node(k) for k in sample}
    ring.remove_node(gone)
    for key, owner in before.items():
        if owner != gone:
            assert ring.get_node(key) == owner
        else:
            assert ring.get_node(key) != gone


@settings(max_examples=60, deadline=None)
@given(
    variant=variants, count=st.integers(min_value=1, max_value=12), key=keys, n=st.integers(0, 15)
)
def test_get_nodes_are_distinct_and_start_with_get_node(variant, count, key, n):
    ring = Continuum(node_list(count), variant=variant)
    found = ring.get_nodes(key, n)
    assert len(found) == min(n, count)
    assert len(set(found)) == len(found)
    if found:
        assert found[0] == ring.get_node(key)
    assert found == ring.get_nodes(key, count)[: len(found)]


@settings(max_examples=60, deadline=None)
@given(variant=variants, count=st.integers(min_value=2, max_value=MAX_STABLE), key=keys)
def test_get_nodes_walks_the_ring_like_a_failover(variant, count, key):
    """The next node in get_nodes is where the key goes once the owner is removed."""
    nodes = node_list(count)
    ring = Continuum(nodes, variant=variant)
    walk = ring.get_nodes(key, count)
    for owner, successor in itertools.pairwise(walk):
        ring.remove_node(owner)
        assert ring.get_node(key) == successor


def test_shares_sum_to_one_and_follow_weights():
    nodes = node_list(4)
    equal = Continuum(nodes).shares()
    assert list(equal) == nodes
    assert sum(equal.values()) == pytest.approx(1.0)
    assert all(0.15 < s < 0.35 for s in equal.values())
    weighted = Continuum(nodes, weights=[1, 1, 1, 5]).shares()
    assert weighted[nodes[3]] == pytest.approx(5 / 8, abs=0.08)


def test_a_server_can_be_weighted_off_the_ring():
    light, heavy = node_list(2)
    ring = Continuum([light, heavy], weights=[1, 10**6])
    assert ring.point_counts()[light] == 0
    assert ring.shares()[light] == 0
    assert {ring.get_node(f"k{i}") for i in range(500)} == {heavy}


# -- weights in float32 (spec sections 1-4) -----------------------------------


def test_libmemcached_float32_weights_give_124_points_not_128():
    nodes = node_list(5)
    counts = Continuum(nodes, weights=[4, 8, 5, 1, 7]).point_counts()
    # pct*160/4*5 = 31.999998 in float32 -> 31 digests where exact maths says 32 (and
    # 63, 7 for 8 and 1); pylibmc and nutcracker agree (test_ketama_interop.py).
    assert list(counts.values()) == [124, 252, 160, 28, 224]
    for variant in ("twemproxy", "twemproxy-fnv1a_64", "spymemcached"):
        assert Continuum(nodes, weights=[4, 8, 5, 1, 7], variant=variant).point_counts() == counts
    # libketama's floorf(pct * 40.0 * n) keeps the product in double: 32 digests.
    libketama = Continuum(nodes, weights=[4, 8, 5, 1, 7], variant="libketama").point_counts()
    assert list(libketama.values()) == [128, 256, 160, 32, 224]


def test_equal_weights_are_not_always_160_points():
    assert set(Continuum(node_list(24)).point_counts().values()) == {160}
    assert set(Continuum(node_list(25)).point_counts().values()) == {156}  # 39.999996
    assert set(Continuum(node_list(60), variant="libketama").point_counts().values()) == {160}
    assert set(Continuum(node_list(61), variant="libketama").point_counts().values()) == {156}


def test_spymemcached_weighs_only_when_given_weights():
    nodes = node_list(25)
    assert set(Continuum(nodes, variant="spymemcached").point_counts().values()) == {160}
    weighted = Continuum(nodes, weights=[1] * 25, variant="spymemcached")
    assert set(weighted.point_counts().values()) == {156}


def test_spymemcached_add_node_with_a_weight_turns_weighting_on():
    ring = Continuum(node_list(2), variant="spymemcached")
    ring.add_node(node_list(3)[2], weight=2)
    assert list(ring.point_counts().values()) == [120, 120, 240]  # weights 1, 1, 2


def test_libmemcached_ketama_switches_to_weighted_md5_points_on_weight_over_one():
    nodes = node_list(3)
    assert set(Continuum(nodes, variant="libmemcached-ketama").point_counts().values()) == {100}
    assert set(
        Continuum(nodes, weights=[1, 1, 1], variant="libmemcached-ketama").point_counts().values()
    ) == {100}
    weighted = Continuum(nodes, weights=[1, 2, 1], variant="libmemcached-ketama")
    md5_ring = Continuum(nodes, weights=[1, 2, 1], variant="libmemcached")
    assert (
        weighted.point_counts()
        == md5_ring.point_counts()
        == dict(zip(nodes, [120, 240, 120], strict=True))
    )
    # ... but keys keep the one-at-a-time hash, so the two rings route differently.
    sample = [f"user:{i}" for i in range(500)]
    assert any(weighted.get_node(k) != md5_ring.get_node(k) for k in sample)


# -- hashes ---------------------------------------------------------------------


def _unsigned_one_at_a_time(key: bytes) -> int:
    h = 0
    for b in key:
        h = (h + b) & 0xFFFFFFFF
        h = (h + (h << 10)) & 0xFFFFFFFF
        h ^= h >> 6
    h = (h + (h << 3)) & 0xFFFFFFFF
    h ^= h >> 11
    return (h + (h << 15)) & 0xFFFFFFFF


def test_one_at_a_time_published_vectors():
    assert one_at_a_time_hash(b"a") == 0xCA2E9442
    assert one_at_a_time_hash(b"The quick brown fox jumps over the lazy dog") == 0x519E91F5


@given(st.binary(min_size=1, max_size=40))
def test_one_at_a_time_sign_extends_bytes_over_0x7f(key):
    """libhashkit reads keys through a signed char: exactly the non-ASCII keys differ."""
    same = one_at_a_time_hash(key) == _unsigned_one_at_a_time(key)
    assert same == (max(key) < 0x80)


def test_one_at_a_time_non_ascii_pinned():
    # 'é' is C3 A9: both bytes enter as 0xFFFFFFC3, 0xFFFFFFA9.
    assert one_at_a_time_hash("é".encode()) == 26298542
    assert one_at_a_time_hash("é".encode()) != _unsigned_one_at_a_time("é".encode())


def test_fnv1a_64_is_the_low_32_bits_of_fnv1a_64_for_ascii():
    # FNV-1a 64 published vectors: "a" -> 0xaf63dc4c8601ec8c, "foobar" -> 0x85944171f73967e8.
    assert fnv1a_64_hash(b"a") == 0x8601EC8C
    assert fnv1a_64_hash(b"foobar") == 0xF73967E8
    # Non-ASCII bytes are sign-extended before the xor (twemproxy's nc_fnv.c).
    assert fnv1a_64_hash(b"\xe9") == ((0x84222325 ^ 0xFFFFFFE9) * 0x1B3) & 0xFFFFFFFF


def test_md5_hash_is_le32_of_the_digest():
    assert md5_hash(b"") == 0xD98C1DD4  # md5("") = d41d8cd9...


# -- ties: equal points -----------------------------------------------------------

# Real MD5 collisions (found by a birthday search): the two labels share one point
# and the key hashes just below it, so it belongs to whoever owns that point.
TIES = [
    ("10.0.218.1:11300", "10.2.23.1:11300", "tie-85", 2259929100),  # lengths 16 and 15
    ("10.101.181.1:11300", "10.101.222.1:11300", "tie-26", 4136552571),  # same length
]


def _md5_points(label: str) -> set[int]:
    digests = (hashlib.md5(f"{label}-{n}".encode()).digest() for n in range(40))
    return {p for d in digests for p in struct.unpack("<4I", d)}


@pytest.mark.parametrize(("a", "b", "key", "point"), TIES)
def test_tie_pairs_really_collide(a, b, key, point):
    assert _md5_points(a) & _md5_points(b) == {point}
    below = max(p for p in _md5_points(a) | _md5_points(b) if p < point)
    assert below < md5_hash(key.encode()) <= point


@pytest.mark.parametrize(("a", "b", "key", "point"), TIES)
@pytest.mark.parametrize("variant", ["libmemcached", "libketama"])
def test_equal_points_go_to_the_first_listed_server(variant, a, b, key, point):
    """libmemcached sorts by (value, index); libketama's qsort is stable (pylibmc, C libketama)."""
    assert Continuum([a, b], variant=variant).get_node(key) == a
    assert Continuum([b, a], variant=variant).get_node(key) == b


@pytest.mark.parametrize(("a", "b", "key", "point"), TIES)
def test_equal_points_go_to_the_last_listed_server_in_spymemcached(a, b, key, point):
    """TreeMap.put: the later node overwrites the point (confirmed with spymemcached 2.12.3)."""
    assert Continuum([a, b], variant="spymemcached").get_node(key) == b
    assert Continuum([b, a], variant="spymemcached").get_node(key) == a


@pytest.mark.parametrize(("a", "b", "key", "point"), TIES)
def test_twemproxy_gives_equal_points_to_the_shortest_then_smallest_label(a, b, key, point):
    """nutcracker sorts its servers by name before building the ring (nutcracker 0.5.0)."""
    winner = min(a, b, key=lambda label: (len(label), label))
    for nodes in ([a, b], [b, a]):
        assert Continuum(nodes, variant="twemproxy").get_node(key) == winner
        # With names, the names are the labels: the name decides, not the address.
        addresses = ["10.9.9.1:1", "10.9.9.2:2"]
        named = Continuum(addresses, variant="twemproxy", names=nodes)
        assert named.get_node(key) == addresses[nodes.index(winner)]


# -- points: the ring as inspection reads it ----------------------------------------


@given(
    variant=st.sampled_from(["libmemcached", "libketama", "spymemcached"]),  # md5 key hashes
    count=node_counts,
    key=text_keys,
)
def test_points_are_the_ring_lookups_use(variant, count, key):
    ring = Continuum(node_list(count), variant=variant)
    points = ring.points()
    hashes = [point for point, _ in points]
    assert hashes == sorted(hashes)
    assert Counter(node for _, node in points) == ring.point_counts()
    # The first point >= the key's hash owns it, wrapping past the last point.
    index = bisect_left(hashes, md5_hash(key.encode()))
    assert points[index % len(points)][1] == ring.get_node(key)


@pytest.mark.parametrize(("a", "b", "key", "point"), TIES)
@pytest.mark.parametrize("variant", ["libketama", "spymemcached"])
def test_points_list_the_owner_of_an_equal_point_first(variant, a, b, key, point):
    ring = Continuum([a, b], variant=variant)
    owner = ring.get_node(key)
    assert [node for p, node in ring.points() if p == point] == [owner, b if owner == a else a]


def test_an_empty_ring_has_no_points():
    assert Continuum([]).points() == []


# -- labels -----------------------------------------------------------------------


def test_port_11211_is_left_out_of_libmemcached_and_twemproxy_labels():
    # libmemcached hashes "host-N" for port 11211, so "host" and "host:11211" are one server.
    assert_same_routing(
        Continuum(["a.example", "b.example"]), Continuum(["a.example:11211", "b.example:11211"])
    )
    # twemproxy names replace the address; with no name the address minus 11211 is used.
    named = Continuum(
        ["10.0.0.1:1", "10.0.0.2:2"], variant="twemproxy", names=["a.example", "b.example"]
    )
    plain = Continuum(["a.example:11211", "b.example:11211"], variant="twemproxy")
    assert_same_routing(
        named, plain, mapping={"10.0.0.1:1": "a.example:11211", "10.0.0.2:2": "b.example:11211"}
    )
    # libketama and spymemcached keep the port.
    libketama = Continuum(["a.example:11211", "b.example:11211"], variant="libketama")
    assert any(libketama.get_node(f"k{i}") != plain.get_node(f"k{i}") for i in range(200))


def test_unix_socket_labels():
    """libmemcached hashes "path:0-N", twemproxy "path:-N" (checked with pylibmc and nutcracker)."""
    socks = ["/run/mc/a.sock", "/run/mc/b.sock"]
    as_names = dict(zip(["10.0.0.1:1", "10.0.0.2:2"], socks, strict=True))
    libmemcached = Continuum(socks)
    twemproxy = Continuum(socks, variant="twemproxy")
    for ring, suffix in ((libmemcached, ":0"), (twemproxy, ":")):
        named = Continuum(list(as_names), variant="twemproxy", names=[s + suffix for s in socks])
        assert_same_routing(named, ring, mapping=as_names)
    assert Continuum(["unix:/run/mc/a.sock"]).nodes == ("unix:/run/mc/a.sock",)


def assert_same_routing(a: Continuum, b: Continuum, mapping: dict[str, str] | None = None) -> None:
    mapping = mapping or dict(zip(a.nodes, b.nodes, strict=True))
    for i in range(500):
        assert mapping[a.get_node(f"key:{i}")] == b.get_node(f"key:{i}")


# -- uhashring ----------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, MAX_STABLE), sample=st.lists(text_keys, min_size=50, max_size=50))
def test_agrees_with_uhashring_when_no_port_is_11211(count, sample):
    uhashring = pytest.importorskip("uhashring")
    nodes = node_list(count)
    theirs = uhashring.HashRing(nodes, hash_fn="ketama")
    for variant in ("libmemcached", "libketama", "twemproxy", "spymemcached"):
        ring = Continuum(nodes, variant=variant)
        assert [ring.get_node(k) for k in sample] == [theirs.get_node(k) for k in sample]


def test_uhashring_differs_on_a_hash_equal_to_a_point():
    """uhashring's bisect_right takes the first point strictly above the hash; C takes >=."""
    uhashring = pytest.importorskip("uhashring")
    nodes = [f"127.0.0.1:{port}" for port in range(11212, 11216)]
    key = "127.0.0.1:11212-1"  # its hash is the first point of that server's digest 1
    assert Continuum(nodes, variant="libketama").get_node(key) == "127.0.0.1:11212"
    assert uhashring.HashRing(nodes, hash_fn="ketama").get_node(key) == "127.0.0.1:11213"


# -- mutation and the pymemcache hasher interface ---------------------------------


def test_add_and_remove_node_rebuild_the_same_ring():
    nodes = node_list(4)
    grown = Continuum(nodes[:2])
    grown.add_node(nodes[2])
    grown.add_node(nodes[3], weight=2)
    built = Continuum(nodes, weights=[1, 1, 1, 2])
    assert grown.nodes == built.nodes
    assert grown.weights == built.weights
    assert_same_routing(grown, built)
    grown.remove_node(nodes[3])
    assert_same_routing(grown, Continuum(nodes[:3]))
    assert len(grown) == 3
    assert nodes[0] in grown
    assert nodes[3] not in grown


def test_twemproxy_add_node_takes_a_name():
    ring = Continuum(["10.0.0.1:1"], variant="twemproxy", names=["a"])
    ring.add_node("10.0.0.2:2", name="b")
    assert_same_routing(
        ring, Continuum(["10.0.0.1:1", "10.0.0.2:2"], variant="twemproxy", names=["a", "b"])
    )


def test_pymemcache_hash_client_uses_the_continuum(memcached_3):
    for server in memcached_3:
        server.flush()
    hasher = functools.partial(Continuum, (), variant="libmemcached")
    client = HashClient([("127.0.0.1", s.port) for s in memcached_3], hasher=hasher)
    ring = Continuum([s.spec for s in memcached_3])
    sample = [f"hash-client:{i}" for i in range(300)]
    for key in sample:
        client.set(key, b"1", noreply=False)
    for server in memcached_3:
        direct = Client(("127.0.0.1", server.port))
        held = direct.get_many(sample)
        direct.close()
        assert held
        assert all(ring.get_node(k) == server.spec for k in held)
    client.close()


# -- errors ------------------------------------------------------------------------


def test_unknown_variant_names_the_choices():
    with pytest.raises(ConfigurationError, match="'libmemcached', 'libmemcached-ketama'") as info:
        Continuum(["a:1"], variant="ketama")
    assert info.value.choices == VARIANTS
    assert isinstance(info.value, ValueError)


def test_empty_ring():
    ring = Continuum([])
    with pytest.raises(ConfigurationError, match="no nodes"):
        ring.get_node("key")
    with pytest.raises(ConfigurationError, match="no nodes"):
        ring.get_nodes("key", 2)
    assert ring.shares() == {}
    ring.add_node("10.0.0.1:11211")
    assert ring.get_node("key") == "10.0.0.1:11211"
    ring.remove_node("10.0.0.1:11211")
    with pytest.raises(ConfigurationError):
        ring.get_node("key")


@pytest.mark.parametrize(
    "weights", [[1, 0], [1, -2], [1, 1.5], [1, True], [1, "2"], [1], [1, 1, 1]]
)
def test_bad_weights(weights):
    with pytest.raises(ConfigurationError):
        Continuum(["a:1", "b:2"], weights=weights)


def test_bad_weight_on_add_node():
    ring = Continuum(["a:1"])
    with pytest.raises(ConfigurationError):
        ring.add_node("b:2", weight=0)
    assert ring.nodes == ("a:1",)


@pytest.mark.parametrize(
    "nodes",
    [
        ["a:1", "a:1"],
        ["a.example", "a.example:11211"],  # one libmemcached server, two spellings
        ["a:1:2"],  # weights go in weights=
        ["a:1 name"],
        [""],
        [42],
        ["a:0"],
        ["a:99999"],
    ],
)
def test_bad_or_duplicate_nodes(nodes):
    with pytest.raises(ConfigurationError):
        Continuum(nodes)


def test_duplicate_add_node():
    ring = Continuum(["a:1"])
    with pytest.raises(ConfigurationError, match="twice"):
        ring.add_node("a:1")


def test_names():
    with pytest.raises(ConfigurationError, match="2 names for 1 nodes"):
        Continuum(["a:1"], variant="twemproxy", names=["x", "y"])
    with pytest.raises(ConfigurationError, match="twemproxy"):
        Continuum(["a:1"], variant="libmemcached", names=["x"])
    with pytest.raises(ConfigurationError):
        Continuum(["a:1"], variant="twemproxy", names=["two words"])
    with pytest.raises(ConfigurationError, match="same ketama server"):
        Continuum(["a:1", "b:2"], variant="twemproxy", names=["x", "x"])
    # None keeps the address, for every variant.
    assert Continuum(["a:1"], names=[None]).nodes == ("a:1",)


def test_remove_unknown_node():
    with pytest.raises(ConfigurationError, match="not in the ring"):
        Continuum(["a:1"]).remove_node("b:2")


def test_get_nodes_rejects_negative_counts():
    with pytest.raises(ValueError, match="non-negative"):
        Continuum(["a:1"]).get_nodes("k", -1)
