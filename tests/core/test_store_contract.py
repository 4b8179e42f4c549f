"""The Store contract: one suite, run against every Store implementation.

The same assertions run on the in-process :class:`MemoryStore` and on a
:class:`Cluster` of real memcached 1.6 servers (one and three of them), so the
embedded store is proven to answer exactly as memcached does.  Expectations that
look odd (``decr`` of ``b"10"`` leaving ``b"9 "``, a failed oversized ``set``
deleting the old item, the 59-byte item header in the size limit) are what
memcached 1.6.18 answers.

TTL tests that need time to pass sleep once (2.1 s); memcached's clock ticks in
whole seconds, so an item stored with ``expire=2`` lives more than 1 and at most
2 seconds.  Fake-clock variants for the MemoryStore are in ``test_memory.py``.

To run the suite against another store, subclass :class:`TestStoreContract`
and override the ``store`` and ``servers`` fixtures.
"""

from __future__ import annotations

import datetime
import decimal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from django_mcpatterns.core.envelope import Envelope
from django_mcpatterns.core.exceptions import (
    InvalidKeyError,
    NeedsMetaProtocolError,
    NonNumericValueError,
    ValueTooLargeError,
)
from django_mcpatterns.core.leases import PLACEHOLDER
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE, Store
from tests.conftest import flush
from tests.harness import (
    COMMAND_COUNTERS,
    MemcachedServer,
    missing,
    server_counters,
    ttl_over_meta,
)

ITEM_SIZE_MAX = 1024 * 1024  # memcached's default -I
ITEM_HEADER = 59  # sizeof(item) + key NUL + "\r\n" + CAS, in memcached 1.6
KIB = 1024
COUNTERS = ("get_hits", "get_misses")

# Which session fixture provides each store's servers (None: in-process).
SERVER_FIXTURES: dict[str, str | None] = {
    "memory": None,
    "cluster-1": "memcached_1",
    "cluster-3": "memcached_3",
    "cluster-3-text": "memcached_3",
}
# The protocol of each cluster (OPTIONS["protocol"]); "meta" unless named here.
PROTOCOLS = {"cluster-3-text": "text"}


@dataclass
class Point:
    """A user type, to prove pickled objects round-trip."""

    x: int
    y: int


def cluster_class() -> type:
    try:
        from django_mcpatterns.core.cluster import Cluster
    except (ImportError, AttributeError) as exc:
        missing(f"django_mcpatterns.core.cluster.Cluster is not available ({exc!r})")
    return Cluster


def equal_with_type(got: Any, expected: Any) -> bool:
    return type(got) is type(expected) and got == expected


ROUND_TRIP_VALUES = [
    pytest.param(b"raw bytes", id="bytes"),
    pytest.param(b"", id="empty-bytes"),
    pytest.param(bytes(range(256)) + b"\r\nEND\r\n", id="binary"),
    pytest.param("text", id="str"),
    pytest.param("ünïcödé ☃ 🎉", id="unicode-str"),
    pytest.param("", id="empty-str"),
    pytest.param(0, id="zero"),
    pytest.param(42, id="int"),
    pytest.param(-7, id="negative-int"),
    pytest.param(2**80, id="big-int"),
    pytest.param(None, id="none"),
    pytest.param(False, id="false"),
    pytest.param(True, id="true"),
    pytest.param(0.0, id="zero-float"),
    pytest.param(3.25, id="float"),
    pytest.param([], id="empty-list"),
    pytest.param({}, id="empty-dict"),
    pytest.param((), id="empty-tuple"),
    pytest.param({"nested": [1, (2, "3")], b"k": {None}}, id="nested"),
    pytest.param(Point(1, 2), id="object"),
    pytest.param(decimal.Decimal("1.10"), id="decimal"),
    pytest.param(datetime.datetime(2024, 2, 29, 12, 30, tzinfo=datetime.UTC), id="datetime"),
]

VALID_KEYS = [
    pytest.param("plain:key", id="str"),
    pytest.param(b"bytes:key", id="bytes"),
    pytest.param("ключ:☃:🎉", id="unicode"),
    pytest.param("k" * 250, id="250-ascii"),
    pytest.param("é" * 125, id="250-bytes-utf8"),
    pytest.param("sym:!#$%&'()*+,-./;<=>?@[\\]^_`{|}~\"", id="punctuation"),
]

INVALID_KEYS: list[Any] = [
    "",
    b"",
    "with space",
    "new\nline",
    "crlf\r\nget x",
    "tab\tkey",
    b"nul\x00byte",
    "del\x7f",
    "k" * 251,
    "é" * 126,  # 252 bytes in UTF-8
    42,
    None,
]

# Every method of the protocol that takes a key, called with ``key``.
KEYED_CALLS: dict[str, Callable[[Store, Any], object]] = {
    "get": lambda s, k: s.get(k),
    "gets": lambda s, k: s.gets(k),
    "get_many": lambda s, k: s.get_many(["fine", k]),
    "gets_many": lambda s, k: s.gets_many(["fine", k]),
    "set": lambda s, k: s.set(k, 1),
    "set_many": lambda s, k: s.set_many({"fine": 1, k: 2}),
    "add": lambda s, k: s.add(k, 1),
    "append": lambda s, k: s.append(k, b"x"),
    "prepend": lambda s, k: s.prepend(k, b"x"),
    "cas": lambda s, k: s.cas(k, 1, b"1"),
    "incr": lambda s, k: s.incr(k),
    "decr": lambda s, k: s.decr(k),
    "delete": lambda s, k: s.delete(k),
    "delete_many": lambda s, k: s.delete_many(["fine", k]),
    "touch": lambda s, k: s.touch(k, 10),
    "bump": lambda s, k: s.bump(k),
    "ttl": lambda s, k: s.ttl(k),
    "gets_ttl": lambda s, k: s.gets_ttl(k),
    "add_cas": lambda s, k: s.add_cas(k, 1),
    "recas": lambda s, k: s.recas(k, 1, b"1"),
    "delete_cas": lambda s, k: s.delete_cas(k, b"1"),
    "gets_leased": lambda s, k: s.gets_leased(k, ["fine"], 30),  # type: ignore[attr-defined]
    "lease": lambda s, k: s.lease(k, 30),  # type: ignore[attr-defined]
}


class TestStoreContract:
    """Memcached's semantics, as every Store must implement them (``core/store.py``)."""

    @pytest.fixture(params=list(SERVER_FIXTURES))
    def store(self, request: pytest.FixtureRequest) -> Iterator[Store]:
        """Every Store implementation, empty at the start of each test."""
        fixture = SERVER_FIXTURES[request.param]
        if fixture is None:
            instance: Store = MemoryStore()
        else:
            cluster = cluster_class()
            servers = request.getfixturevalue(fixture)
            flush(servers)  # the server fixtures are shared by the whole session
            protocol = PROTOCOLS.get(request.param, "meta")
            instance = cluster([s.spec for s in servers], options=ClusterOptions(protocol=protocol))
        yield instance
        instance.close()

    @pytest.fixture
    def servers(self, request: pytest.FixtureRequest, store: Store) -> list[MemcachedServer]:
        """The real servers behind ``store`` (none for an in-process store)."""
        fixture = SERVER_FIXTURES[request.node.callspec.params["store"]]
        return [] if fixture is None else request.getfixturevalue(fixture)

    @pytest.fixture
    def protocol(self, request: pytest.FixtureRequest, store: Store) -> str:
        """The protocol ``store`` speaks: "text" sends no meta command (no ``ttl``)."""
        return PROTOCOLS.get(request.node.callspec.params["store"], "meta")

    @pytest.fixture
    def wire_commands(self, servers: list[MemcachedServer]) -> Callable[[], int]:
        """How many data commands the servers have executed so far."""

        def count() -> int:
            return sum(server_counters(servers, COMMAND_COUNTERS).values())

        return count

    # -- the protocol and round trips ---------------------------------------

    def test_is_a_store(self, store: Store) -> None:
        assert isinstance(store, Store)

    @pytest.mark.parametrize("value", ROUND_TRIP_VALUES)
    def test_round_trip_keeps_value_and_type(self, store: Store, value: Any) -> None:
        assert store.set("value", value) is True
        assert equal_with_type(store.get("value", default="miss"), value)
        got, token = store.gets("value")
        assert equal_with_type(got, value)
        assert token is not None
        assert equal_with_type(store.get_many(["value"])["value"], value)

    def test_get_returns_a_fresh_object(self, store: Store) -> None:
        store.set("list", [1, 2])
        first = store.get("list")
        first.append(3)
        assert store.get("list") == [1, 2]

    def test_miss_returns_default(self, store: Store) -> None:
        sentinel = object()
        assert store.get("missing") is None
        assert store.get("missing", default=sentinel) is sentinel
        assert store.gets("missing") == (None, None)

    def test_stored_none_is_a_hit(self, store: Store) -> None:
        store.set("none", None)
        assert store.get("none", default="miss") is None
        assert store.get_many(["none", "missing"]) == {"none": None}

    # -- keys ---------------------------------------------------------------

    @pytest.mark.parametrize("key", VALID_KEYS)
    def test_valid_keys_work_with_every_primitive(self, store: Store, key: str | bytes) -> None:
        assert store.add(key, b"1") is True
        assert store.append(key, b"0") is True
        assert store.incr(key, 5) == 15
        assert store.get_many([key]) == {key: b"15"}
        _, token = store.gets(key)
        assert store.cas(key, "v", token) is True
        assert store.touch(key, 100) is True
        assert store.get(key) == "v"
        assert store.delete(key) is True
        assert store.get(key) is None

    def test_str_and_bytes_keys_name_the_same_item(self, store: Store) -> None:
        store.set("ключ", 1)
        assert store.get("ключ".encode()) == 1
        store.set(b"plain", 2)
        assert store.get("plain") == 2

    @pytest.mark.parametrize("method", list(KEYED_CALLS))
    def test_invalid_keys_raise_before_any_io(
        self, store: Store, wire_commands: Callable[[], int], method: str
    ) -> None:
        store.set("fine", "kept")
        before = wire_commands()
        for key in INVALID_KEYS:
            with pytest.raises(InvalidKeyError):
                KEYED_CALLS[method](store, key)
        assert wire_commands() == before
        assert store.get("fine") == "kept"

    def test_batches_with_an_invalid_key_touch_nothing(self, store: Store) -> None:
        with pytest.raises(InvalidKeyError):
            store.set_many({"new": 1, "bad key": 2})
        assert store.get("new") is None
        store.set("kept", 1)
        with pytest.raises(InvalidKeyError):
            store.delete_many(["kept", "k" * 251])
        assert store.get("kept") == 1

    # -- set / add ------------------------------------------------------------

    def test_set_overwrites(self, store: Store) -> None:
        assert store.set("k", "one") is True
        assert store.set("k", 2) is True
        assert store.get("k") == 2

    def test_add_stores_only_when_missing(self, store: Store) -> None:
        assert store.add("k", "first") is True
        assert store.add("k", "second") is False
        assert store.get("k") == "first"
        store.delete("k")
        assert store.add("k", "third") is True
        assert store.get("k") == "third"

    # -- cas ------------------------------------------------------------------

    def test_cas_with_current_token_stores(self, store: Store) -> None:
        store.set("k", "old")
        value, token = store.gets("k")
        assert value == "old"
        assert store.cas("k", "new", token) is True
        assert store.get("k") == "new"

    def test_cas_tokens_may_be_given_as_int_str_or_bytes(self, store: Store) -> None:
        for convert in (int, lambda t: t.decode(), bytes):
            store.set("k", "old")
            _, token = store.gets("k")
            digits = token if isinstance(token, bytes) else str(token).encode()
            assert store.cas("k", "new", convert(digits)) is True

    def test_cas_with_stale_token_fails(self, store: Store) -> None:
        store.set("k", "old")
        _, token = store.gets("k")
        store.set("k", "changed")
        assert store.cas("k", "mine", token) is False
        assert store.get("k") == "changed"
        _, fresh = store.gets("k")
        assert store.cas("k", "mine", fresh) is True
        assert store.cas("k", "again", fresh) is False

    def test_cas_on_missing_key_returns_none(self, store: Store) -> None:
        store.set("k", 1)
        _, token = store.gets("k")
        store.delete("k")
        assert store.cas("k", 2, token) is None
        assert store.get("k") is None

    def test_cas_tokens_change_on_every_write_but_not_on_reads_or_touch(self, store: Store) -> None:
        store.set("k", b"1")
        seen = [store.gets("k")[1]]
        writes: list[Callable[[], object]] = [
            lambda: store.set("k", b"2"),
            lambda: store.append("k", b"0"),
            lambda: store.prepend("k", b"1"),
            lambda: store.incr("k", 0),
            lambda: store.decr("k", 1),
            lambda: store.cas("k", b"7", store.gets("k")[1]),
        ]
        for write in writes:
            write()
            token = store.gets("k")[1]
            assert token not in seen
            seen.append(token)
        store.get("k")
        store.touch("k", 100)
        assert store.gets("k")[1] == seen[-1]
        assert store.gets_many(["k"])["k"] == (b"7", seen[-1])

    def test_cas_with_negative_expire_deletes_only_for_the_owner(self, store: Store) -> None:
        # The owner-safe release of an add-based lock.
        store.set("lock", "owner-a")
        _, token = store.gets("lock")
        store.set("lock", "owner-b")
        assert store.cas("lock", "owner-a", token, expire=-1) is False
        assert store.get("lock") == "owner-b"
        _, token = store.gets("lock")
        assert store.cas("lock", "owner-b", token, expire=-1) is True
        assert store.get("lock") is None

    # -- incr / decr ------------------------------------------------------------

    def test_incr_decr_on_missing_key_return_none(self, store: Store) -> None:
        assert store.incr("counter") is None
        assert store.decr("counter", 5) is None
        assert store.get("counter") is None

    def test_incr_decr_on_an_int_keep_it_an_int(self, store: Store) -> None:
        store.set("counter", 10)
        assert store.incr("counter") == 11
        assert store.incr("counter", 9) == 20
        assert store.decr("counter", 3) == 17
        assert store.incr("counter", 0) == 17
        assert equal_with_type(store.get("counter"), 17)

    def test_incr_decr_keep_the_items_flags(self, store: Store) -> None:
        store.set("text", "41")
        assert store.incr("text") == 42
        assert store.get("text") == "42"
        store.set("raw", b"41")
        assert store.incr("raw") == 42
        assert store.get("raw") == b"42"

    def test_incr_wraps_at_2_to_the_64(self, store: Store) -> None:
        store.set("counter", 2**64 - 1)
        assert store.incr("counter") == 0
        store.set("counter", 5)
        assert store.incr("counter", 2**64 - 1) == 4

    def test_decr_stops_at_zero(self, store: Store) -> None:
        store.set("counter", 5)
        assert store.decr("counter", 10) == 0
        assert store.decr("counter") == 0
        assert store.get("counter") == 0

    def test_shorter_number_is_padded_longer_one_grows(self, store: Store) -> None:
        # memcached rewrites a number that fits in place, padded with spaces.
        store.set("raw", b"10")
        assert store.decr("raw") == 9
        assert store.get("raw") == b"9 "
        assert store.incr("raw") == 10
        assert store.get("raw") == b"10"
        assert store.incr("raw", 990) == 1000
        assert store.get("raw") == b"1000"
        store.set("int", 100)
        assert store.decr("int", 95) == 5
        assert equal_with_type(store.get("int"), 5)

    @pytest.mark.parametrize(
        ("stored", "result", "after"),
        [
            (b" 5", 6, b"6 "),
            (b"+5", 6, b"6 "),
            (b"007", 8, b"8  "),
            (b"5 trailing words", 6, b"6".ljust(16)),
            (b"5\t", 6, b"6 "),
            (b"-0", 1, b"1 "),
        ],
    )
    def test_incr_reads_numbers_like_strtoull(
        self, store: Store, stored: bytes, result: int, after: bytes
    ) -> None:
        store.set("n", stored)
        assert store.incr("n") == result
        assert store.get("n") == after

    @pytest.mark.parametrize(
        "stored",
        [b"abc", b"", b"-5", b"1.5", b"5abc", b"0x10", b"18446744073709551616", ["pickled"]],
    )
    def test_incr_decr_of_a_non_number_raise(self, store: Store, stored: Any) -> None:
        store.set("n", stored)
        with pytest.raises(NonNumericValueError):
            store.incr("n")
        with pytest.raises(NonNumericValueError):
            store.decr("n")
        assert store.get("n") == stored

    # -- append / prepend ---------------------------------------------------------

    def test_append_and_prepend_raw_bytes(self, store: Store) -> None:
        store.set("k", b"middle")
        assert store.append("k", b">end") is True
        assert store.prepend("k", b"start<") is True
        assert store.get("k") == b"start<middle>end"

    def test_append_prepend_on_missing_key_fail(self, store: Store) -> None:
        assert store.append("missing", b"x") is False
        assert store.prepend("missing", b"x") is False
        assert store.get("missing") is None

    def test_append_keeps_the_items_flags(self, store: Store) -> None:
        store.set("text", "abc")
        store.append("text", "déf".encode())
        assert store.get("text") == "abcdéf"
        store.set("int", 12)
        store.append("int", b"3")
        assert equal_with_type(store.get("int"), 123)

    def test_append_past_the_size_limit_fails_and_keeps_the_item(self, store: Store) -> None:
        original = b"a" * (600 * KIB)
        store.set("k", original)
        assert store.append("k", b"b" * (600 * KIB)) is False
        assert store.prepend("k", b"b" * (600 * KIB)) is False
        assert store.get("k") == original
        assert store.append("k", b"b") is True

    def test_append_prepend_take_only_bytes(self, store: Store) -> None:
        store.set("k", b"raw")
        for value in ("text", 1, None):
            with pytest.raises(TypeError):
                store.append("k", value)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                store.prepend("k", value)  # type: ignore[arg-type]
        assert store.get("k") == b"raw"

    # -- argument errors ---------------------------------------------------------

    @pytest.mark.parametrize("delta", [-1, 2**64, True, 1.0, "1"])
    def test_incr_decr_refuse_deltas_memcached_cannot_take(self, store: Store, delta: Any) -> None:
        store.set("n", 5)
        with pytest.raises(ValueError, match="delta"):
            store.incr("n", delta)
        with pytest.raises(ValueError, match="delta"):
            store.decr("n", delta)
        assert store.get("n") == 5

    @pytest.mark.parametrize("expire", [1.5, "10", None])
    def test_non_integer_exptimes_are_refused(self, store: Store, expire: Any) -> None:
        with pytest.raises(ValueError, match="expire"):
            store.set("k", 1, expire=expire)
        with pytest.raises(ValueError, match="expire"):
            store.set_many({"k": 1}, expire=expire)
        with pytest.raises(ValueError, match="expire"):
            store.add("k", 1, expire=expire)
        assert store.get("k") is None
        store.set("k", 1)
        with pytest.raises(ValueError, match="expire"):
            store.touch("k", expire)

    @pytest.mark.parametrize("token", [b"not-a-token", "12x", None, -1, True, 1.0])
    def test_malformed_cas_tokens_are_refused(self, store: Store, token: Any) -> None:
        store.set("k", 1)
        with pytest.raises(ValueError, match="cas"):
            store.cas("k", 2, token)
        assert store.get("k") == 1

    # -- touch / delete / flush ---------------------------------------------------

    def test_touch(self, store: Store) -> None:
        assert store.touch("missing", 10) is False
        store.set("k", 1)
        assert store.touch("k", 10) is True
        assert store.get("k") == 1

    def test_bump_keeps_value_cas_and_ttl_and_creates_nothing(self, store: Store) -> None:
        # memcached's "touching keys with add": meta mg <key>, text add of an expired item.
        assert store.bump("missing") is False
        assert store.get("missing", "miss") == "miss"
        assert store.add("missing", "added") is True  # the bump left nothing behind
        store.set("k", {"v": 1}, expire=600)
        _, token = store.gets("k")
        assert store.bump("k") is True
        assert store.gets("k") == ({"v": 1}, token)
        ttl = store.gets_ttl("k")[2]
        assert ttl is None or 595 <= ttl <= 600  # None: text mode reads no TTL

    def test_ttl_is_the_seconds_left(self, store: Store, protocol: str) -> None:
        # memcached's mg <key> t: -1 for never, None for a missing item.
        if protocol == "text":
            pytest.skip("text mode has no TTL read: test_ttl_needs_the_meta_protocol")
        assert store.ttl("missing") is None
        store.set("forever", 1)
        assert store.ttl("forever") == -1
        store.set("minute", b"1", expire=60)
        assert store.ttl("minute") in (59, 60)
        store.append("minute", b"0")  # keeps the TTL
        store.incr("minute")
        assert store.ttl("minute") in (59, 60)
        store.touch("minute", 1000)
        assert store.ttl("minute") in (999, 1000)
        store.cas("minute", 2, store.gets("minute")[1], expire=0)
        assert store.ttl("minute") == -1
        # An absolute exptime; a server's clock may be a second off the wall clock.
        store.set("absolute", 1, expire=int(time.time()) + 3600)
        assert 3598 <= store.ttl("absolute") <= 3601  # type: ignore[operator]
        store.delete("absolute")
        assert store.ttl("absolute") is None

    # -- owner primitives: writes that hand back their cas, a read with the TTL --

    @pytest.fixture(params=["meta", "text"])
    def protocol_store(
        self,
        request: pytest.FixtureRequest,
        store: Store,
        servers: list[MemcachedServer],
        protocol: str,
    ) -> Iterator[Store]:
        """``store``, and for a cluster the same servers over the text protocol too."""
        if protocol == "text":
            pytest.skip("a text store: covered by the text case of every other store")
        if request.param == "meta":
            yield store
            return
        if not servers:
            pytest.skip("the embedded store speaks no protocol")
        from django_mcpatterns.core.options import ClusterOptions

        cluster = cluster_class()(
            [server.spec for server in servers], ClusterOptions(protocol="text")
        )
        yield cluster
        cluster.close()

    def test_gets_ttl_reads_value_cas_and_ttl_together(self, protocol_store: Store) -> None:
        store = protocol_store
        assert store.gets_ttl("missing") == (None, None, None)
        store.set("minute", {"a": [1]}, expire=60)
        value, token, ttl = store.gets_ttl("minute")
        assert value == {"a": [1]}
        assert token == store.gets("minute")[1]
        # Meta (and the embedded store) read the TTL with the value; text cannot.
        assert ttl in (59, 60) or (ttl is None and ttl_over_meta(store, "minute") in (59, 60))
        store.set("forever", b"x")
        assert store.gets_ttl("forever")[2] in (-1, None)

    def test_add_cas_returns_the_new_items_cas(self, protocol_store: Store) -> None:
        store = protocol_store
        token = store.add_cas("k", Point(1, 2), expire=60)
        assert token is not None
        assert store.gets("k") == (Point(1, 2), token)
        assert store.add_cas("k", "other") is None  # exists: not stored
        assert store.get("k") == Point(1, 2)
        assert ttl_over_meta(store, "k") in (59, 60)

    def test_recas_stores_only_over_that_version_and_returns_the_new_cas(
        self, protocol_store: Store
    ) -> None:
        store = protocol_store
        first = store.add_cas("k", b"v1", expire=60)
        assert first is not None
        second = store.recas("k", b"v2", first, expire=1000)
        assert second is not None
        assert second != first
        assert store.gets("k") == (b"v2", second)
        assert ttl_over_meta(store, "k") in (999, 1000)
        assert store.recas("k", b"v3", first) is None  # an older version: not stored
        assert store.get("k") == b"v2"
        assert store.recas("missing", b"v", first) is None

    def test_delete_cas_deletes_only_that_version(self, protocol_store: Store) -> None:
        store = protocol_store
        first = store.add_cas("k", b"mine", expire=60)
        assert first is not None
        store.set("k", b"theirs")  # another writer: a new version
        assert store.delete_cas("k", first) is False
        assert store.get("k") == b"theirs"
        _, current = store.gets("k")
        assert current is not None
        assert store.delete_cas("k", current) is True
        assert store.get("k") is None
        assert store.delete_cas("k", current) is False  # missing

    # -- leasing reads (store.LeaseStore): memcached's mg <key> v c f N<ttl> --

    def test_gets_leased_leases_a_miss_to_one_reader(self, store: Store, protocol: str) -> None:
        store.set_many({"a": Point(1, 2), "b": b"raw"})
        expected = store.gets_many(["a", "b"])
        first = store.gets_leased("k", ["a", "b", "missing"], 30)  # type: ignore[attr-defined]
        assert first.found == expected
        if protocol == "text":  # no lease in text mode: the caller leases some other way
            assert (first.leasing, first.lease, first.pending) == (False, None, False)
            return
        assert first.leasing
        assert first.lease is not None
        assert not first.pending
        assert 29 <= store.ttl("k") <= 30  # type: ignore[operator]
        second = store.gets_leased("k", ["a"], 30)  # type: ignore[attr-defined]
        assert (second.lease, second.pending, second.found) == (None, True, {"a": expected["a"]})
        assert store.get("k") == b""  # a plain read sees the lease's empty item
        assert store.cas("k", [1, 2], first.lease, 60) is True  # the fill, by the lease's cas
        third = store.gets_leased("k", [], 30)  # type: ignore[attr-defined]
        assert third.found == {"k": store.gets("k")}
        assert third.found["k"][0] == [1, 2]
        assert (third.lease, third.pending) == (None, False)

    def test_a_lease_given_back_goes_to_the_next_reader(self, store: Store, protocol: str) -> None:
        if protocol == "text":
            pytest.skip("no lease in text mode")
        lease = store.gets_leased("k", [], 30).lease  # type: ignore[attr-defined]
        assert lease is not None
        assert store.delete_cas("k", lease) is True
        again = store.gets_leased("k", [], 30)  # type: ignore[attr-defined]
        assert again.lease not in (None, lease)
        assert not again.pending

    def test_lease_replaces_only_the_version_found_useless(
        self, store: Store, protocol: str
    ) -> None:
        store.set("k", "old")
        _, useless = store.gets("k")
        assert useless is not None
        taken = store.lease("k", 30, useless)  # type: ignore[attr-defined]
        if protocol == "text":
            assert (taken.leasing, taken.lease, store.get("k")) == (False, None, "old")
            return
        assert taken.lease is not None
        assert (taken.pending, taken.found) == (False, {})
        late = store.lease("k", 30, useless)  # type: ignore[attr-defined]
        assert (late.lease, late.pending) == (None, True)  # the version is gone: a lease holds it
        assert store.cas("k", "new", taken.lease) is True
        assert store.get("k") == "new"
        kept = store.lease("k", 30, useless)  # type: ignore[attr-defined]
        assert (kept.lease, kept.pending, store.get("k")) == (None, False, "new")
        fresh = store.lease("absent", 30)  # type: ignore[attr-defined]
        assert fresh.lease is not None

    def test_ttl_needs_the_meta_protocol(
        self, store: Store, protocol: str, wire_commands: Callable[[], int]
    ) -> None:
        if protocol != "text":
            pytest.skip("meta mode and the embedded store read TTLs")
        store.set("k", 1, expire=60)
        before = wire_commands()
        with pytest.raises(NeedsMetaProtocolError, match="OPTIONS\\['protocol'\\] is 'text'"):
            store.ttl("k")
        assert wire_commands() == before  # refused before any I/O

    def test_reads_count_hits_and_misses_per_key(
        self, store: Store, servers: list[MemcachedServer], protocol: str
    ) -> None:
        def counts() -> tuple[int, int]:
            # A cluster's servers' counters, or the in-process store's own.
            found = server_counters(servers, COUNTERS) if servers else store.stats()  # type: ignore[attr-defined]
            return found["get_hits"], found["get_misses"]

        store.set_many({"a": 1, "b": 2})
        hits, misses = counts()
        store.get("a")
        store.gets("missing")
        store.get_many(["a", "b", "missing", "other"])
        store.gets_many(["b"])
        if protocol == "meta":
            store.ttl("a")  # a meta get
        store.add("a", 3)  # writes count elsewhere
        store.touch("missing", 1)
        assert counts() == (hits + 4 + (protocol == "meta"), misses + 3)

    def test_delete(self, store: Store) -> None:
        store.set("k", 1)
        assert store.delete("k") is True
        assert store.get("k") is None
        assert store.delete("k") is False

    def test_flush_all(self, store: Store) -> None:
        store.set_many({f"key:{i}": i for i in range(50)})
        assert store.flush_all() is True
        assert store.get_many([f"key:{i}" for i in range(50)]) == {}

    def test_data_survives_close(self, store: Store) -> None:
        store.set("k", "kept")
        store.close()
        assert store.get("k") == "kept"
        assert store.set("k2", 2) is True
        store.close()
        assert store.get("k2") == 2

    # -- many keys ----------------------------------------------------------------

    def test_set_many_and_get_many_over_many_keys(
        self, store: Store, servers: list[MemcachedServer]
    ) -> None:
        values: dict[str | bytes, Any] = {f"key:{i}": i for i in range(150)}
        values.update({f"bytes:{i}".encode(): f"value {i}" for i in range(150)})
        assert store.set_many(values) == []
        missing = [f"missing:{i}" for i in range(20)]
        assert store.get_many([*values, *missing]) == values
        # A cluster spreads the keys over every server.
        for server in servers:
            assert server_counters([server], ["curr_items"])["curr_items"] > 0

    def test_gets_many_tokens_work_with_cas(self, store: Store) -> None:
        keys = [f"key:{i}" for i in range(60)]
        store.set_many(dict.fromkeys(keys, "old"))
        found = store.gets_many([*keys, "missing"])
        assert sorted(found) == sorted(keys)
        for key, (value, token) in found.items():
            assert value == "old"
            assert store.cas(key, "new", token) is True
        assert set(store.get_many(keys).values()) == {"new"}

    # -- the soft-expiry envelope's explicit read path (gets_envelope, get_many_envelopes) --

    def test_envelopes_are_read_as_such_only_through_the_explicit_path(self, store: Store) -> None:
        fresh = Envelope("v", soft_expiry=time.time() + 600, hard_expiry=time.time() + 1200)
        stale = Envelope("old", soft_expiry=time.time() - 1, hard_expiry=time.time() + 600)
        store.set("fresh", fresh, 1200)
        store.set("stale", stale, 600)
        store.set("plain", "p")
        # Plain reads: the value while fresh, a miss once stale.
        assert store.get("fresh") == "v"
        assert store.get("stale") is None
        assert store.gets("stale") == (None, None)
        assert store.get_many(["fresh", "stale"]) == {"fresh": "v"}
        # The explicit path: envelopes as such, fresh or stale, with a cas that works.
        found, cas = store.gets_envelope("stale")
        assert found == stale
        assert cas is not None
        assert store.cas("stale", "new", cas) is True
        assert store.gets_envelope("plain")[0] == "p"
        assert store.gets_envelope("missing") == (None, None)
        assert store.get_many_envelopes(["fresh", "plain", "missing"]) == {
            "fresh": fresh,
            "plain": "p",
        }

    def test_a_lease_placeholder_reads_as_a_miss_but_holds_the_key(self, store: Store) -> None:
        assert store.add("k", PLACEHOLDER, 60)
        assert store.get("k") is None
        assert store.get_many(["k"]) == {}
        assert store.add("k", "other") is False
        found, cas = store.gets_envelope("k")
        assert found.pending
        assert store.cas("k", "filled", cas) is True
        assert store.get("k") == "filled"

    def test_delete_many(self, store: Store) -> None:
        keys = [f"key:{i}" for i in range(60)]
        store.set_many(dict.fromkeys(keys, 1))
        store.set("other", 2)
        store.delete_many([*keys, "never-stored"])
        assert store.get_many(keys) == {}
        assert store.get("other") == 2

    def test_empty_batches(self, store: Store) -> None:
        assert store.get_many([]) == {}
        assert store.gets_many([]) == {}
        assert store.set_many({}) == []
        store.delete_many([])

    # -- large values ---------------------------------------------------------------

    def test_large_values_under_the_limit(self, store: Store) -> None:
        raw = bytes(range(256)) * (900 * KIB // 256)
        text = "ü" * (450 * KIB)
        store.set("raw", raw)
        store.set("text", text)
        assert store.get("raw") == raw
        assert store.get("text") == text

    def test_item_size_limit_counts_memcacheds_item_header(self, store: Store) -> None:
        key = "boundary"
        fits = ITEM_SIZE_MAX - ITEM_HEADER - len(key)
        assert store.set(key, b"x" * fits) is True
        with pytest.raises(ValueTooLargeError):
            store.set(key, b"x" * (fits + 1))
        # Non-zero flags (here: str) take 4 more bytes.
        assert store.set(key, "x" * (fits - 4)) is True
        with pytest.raises(ValueTooLargeError):
            store.set(key, "x" * (fits - 3))

    def test_oversized_set_raises_and_removes_the_old_item(self, store: Store) -> None:
        store.set("k", "old")
        with pytest.raises(ValueTooLargeError):
            store.set("k", b"x" * (2 * KIB * KIB))
        assert store.get("k") is None

    def test_oversized_add_and_cas_raise_and_keep_the_old_item(self, store: Store) -> None:
        huge = b"x" * (2 * KIB * KIB)
        store.set("k", "old")
        _, token = store.gets("k")
        with pytest.raises(ValueTooLargeError):
            store.add("k", huge)
        with pytest.raises(ValueTooLargeError):
            store.add("new", huge)
        with pytest.raises(ValueTooLargeError):
            store.cas("k", huge, token)
        assert store.get("k") == "old"
        assert store.get("new") is None
        assert store.cas("k", "new", token) is True

    def test_oversized_value_in_set_many_fails_only_its_key(self, store: Store) -> None:
        store.set("huge", "old")
        small = {f"small:{i}": i for i in range(10)}
        assert store.set_many({**small, "huge": b"x" * (2 * KIB * KIB)}) == ["huge"]
        assert store.get("huge") is None  # the old value is gone, as after a failed set
        assert store.get_many(list(small)) == small

    # -- expiry ---------------------------------------------------------------------

    def test_items_expire_in_real_time(self, store: Store, protocol: str) -> None:
        # One sleep for every TTL rule; expire=2 lives more than 1 s, at most 2 s.
        store.set("set", 1, expire=2)
        store.set_many({"many:1": 1, "many:2": 2}, expire=2)
        store.add("add", 1, expire=2)
        store.set("appended", b"a", expire=2)
        store.append("appended", b"b")  # append keeps the TTL
        store.set("incremented", 1, expire=2)
        store.incr("incremented")  # so does incr
        store.set("shortened", 1, expire=1000)
        store.touch("shortened", 2)
        store.set("extended", 1, expire=2)
        store.touch("extended", 1000)
        store.set("cas-extended", 1, expire=2)
        store.cas("cas-extended", 2, store.gets("cas-extended")[1], expire=1000)
        store.set("forever", 1, expire=0)

        expiring = ["set", "many:1", "many:2", "add", "appended", "incremented", "shortened"]
        lasting = ["extended", "cas-extended", "forever"]
        assert sorted(store.get_many(expiring + lasting)) == sorted(expiring + lasting)

        # Gone within about 2 s on the server's whole-second clock, whose tick a busy machine
        # delays: wait for the expiry itself (a 10 s hang guard), then check what lasts.
        for _ in range(200):
            if not store.get_many(expiring):
                break
            time.sleep(0.05)
        assert sorted(store.get_many([*expiring, *lasting])) == sorted(lasting)
        assert store.get("set") is None
        if protocol == "meta":
            assert store.ttl("set") is None
        assert store.incr("incremented") is None
        assert store.append("appended", b"c") is False
        assert store.touch("set", 100) is False
        assert store.add("add", "again") is True

    def test_absolute_exptimes(self, store: Store) -> None:
        # A server's clock may be a second or two off the wall clock for absolute
        # times, so only clear cases are checked here (boundaries: test_memory.py).
        now = int(time.time())
        store.set("future", 1, expire=now + 3600)
        store.set("past", 1, expire=now - 10)
        store.set("thirty-days", 1, expire=MAX_RELATIVE_EXPIRE)  # still relative
        store.set("1970", 1, expire=MAX_RELATIVE_EXPIRE + 1)  # absolute, long past
        assert sorted(store.get_many(["future", "past", "thirty-days", "1970"])) == [
            "future",
            "thirty-days",
        ]
        assert store.touch("future", now - 10) is True
        assert store.get("future") is None

    def test_negative_exptime_expires_at_once(self, store: Store) -> None:
        assert store.set("new", 1, expire=-1) is True
        assert store.get("new") is None
        store.set("old", 1)
        assert store.set("old", 2, expire=-1) is True
        assert store.get("old") is None  # the old item is replaced too

        assert store.add("added", 1, expire=-1) is True
        assert store.get("added") is None
        assert store.add("added", 2) is True
        assert store.add("added", 3, expire=-1) is False
        assert store.get("added") == 2

        assert store.touch("added", -1) is True
        assert store.get("added") is None
        assert store.set_many({"m:1": 1, "m:2": 2}, expire=-1) == []
        assert store.get_many(["m:1", "m:2"]) == {}
