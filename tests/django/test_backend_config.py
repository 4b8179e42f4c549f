"""Configuring the backends: LOCATION forms, OPTIONS, and the errors for bad ones.

Everything goes through ``settings.CACHES`` and ``django.core.cache.caches``,
as in a project.  Bad settings raise ``ImproperlyConfigured`` when the alias is
first used, naming the offending option and the valid choices.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from pymemcache.client.base import Client

from django_mcpatterns.core.ketama import VARIANTS, Continuum
from django_mcpatterns.core.options import FAILOVER_POLICIES
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND
from tests.harness import MemcachedServer, raw_client, require_binary
from tests.processes import MEMCACHED_STOP, ServerProcess

pytestmark = pytest.mark.usefixtures("reset_shared_stores")


def configured(backend: str, location: Any = None, **options: Any) -> Any:
    """The ``default`` cache built by Django from one ``CACHES`` entry."""
    entry: dict[str, Any] = {"BACKEND": backend}
    if location is not None:
        entry["LOCATION"] = location
    if options:
        entry["OPTIONS"] = options
    with override_settings(CACHES={"default": entry}):
        return caches["default"]


def configuration_error(backend: str, location: Any = None, **options: Any) -> str:
    with pytest.raises(ImproperlyConfigured) as caught:
        configured(backend, location, **options)
    return str(caught.value)


def spread_keys(count: int = 60) -> dict[str, int]:
    return {f"spread:{i}": i for i in range(count)}


# -- LOCATION ----------------------------------------------------------------------


class TestLocation:
    def test_list(self, memcached_3: list[MemcachedServer]) -> None:
        specs = [s.spec for s in memcached_3]
        cache = configured(CLUSTER_BACKEND, specs)
        assert cache.client_servers == specs
        assert cache.set_many(spread_keys()) == []
        assert cache.get_many(list(spread_keys())) == spread_keys()

    @pytest.mark.parametrize("separator", [";", ",", " ; ", ", "])
    def test_separated_string(self, memcached_3: list[MemcachedServer], separator: str) -> None:
        specs = [s.spec for s in memcached_3]
        from_string = configured(CLUSTER_BACKEND, separator.join(specs))
        assert from_string.client_servers == specs
        # The same servers and options are one Cluster, however they were written.
        assert from_string.store is configured(CLUSTER_BACKEND, specs).store

    def test_weights_change_routing(self, memcached_3: list[MemcachedServer]) -> None:
        for server in memcached_3:
            server.flush()
        specs = [s.spec for s in memcached_3]
        weights = [1, 2, 5]
        cache = configured(
            CLUSTER_BACKEND, [f"{s}:{w}" for s, w in zip(specs, weights, strict=True)]
        )
        assert cache.client_servers == specs  # the weight is not part of the node
        weighted = Continuum(specs, weights=weights)
        unweighted = Continuum(specs)
        keys = list(spread_keys(200))
        cache.set_many(dict.fromkeys(keys, 1))
        clients = {s.spec: raw_client(s) for s in memcached_3}
        moved = 0
        for key in keys:
            made = cache.make_key(key)
            owner = weighted.get_node(made)
            holders = [spec for spec, client in clients.items() if client.get(made) is not None]
            assert holders == [owner]
            moved += owner != unweighted.get_node(made)
        assert moved > 0  # the weights were applied, not ignored
        counts = {
            spec: sum(weighted.get_node(cache.make_key(k)) == spec for k in keys) for spec in specs
        }
        assert counts[specs[2]] > counts[specs[0]]
        for client in clients.values():
            client.close()

    def test_no_location(self) -> None:
        message = configuration_error(CLUSTER_BACKEND)
        assert "no memcached servers" in message

    @pytest.mark.parametrize(
        ("location", "named"),
        [
            ("127.0.0.1:notaport", "'notaport'"),
            ("127.0.0.1:11211:0", "weight '0'"),
            ("127.0.0.1:11211:heavy", "weight 'heavy'"),
            ("127.0.0.1:99999", "99999"),
            ("127.0.0.1:11211:1:2", "'127.0.0.1:11211:1:2'"),
            ("127.0.0.1:1;127.0.0.1:1", "127.0.0.1:1 is listed twice"),
            ("[::1", "'[::1'"),
            (";", "no memcached servers"),
            ([], "no memcached servers"),
            (["127.0.0.1:1", 11211], "11211"),
        ],
    )
    def test_invalid(self, location: Any, named: str) -> None:
        assert named in configuration_error(CLUSTER_BACKEND, location)

    @pytest.mark.parametrize(
        ("location", "ketama", "named"),
        [
            (["127.0.0.1:1:1 alpha"], "libmemcached", "server names only apply"),
            (["127.0.0.1:1:1 one", "127.0.0.1:2:1 one"], "twemproxy", "same ketama server"),
        ],
    )
    def test_ring_errors_show_when_the_cache_is_built(
        self, location: list[str], ketama: str, named: str
    ) -> None:
        # The cluster (no connection yet) is built with the backend, not on first use.
        assert named in configuration_error(CLUSTER_BACKEND, location, ketama=ketama)


# -- unix sockets ------------------------------------------------------------------


@pytest.fixture
def unix_memcached(tmp_path: Path) -> Iterator[str]:
    """A memcached listening only on a unix socket in ``tmp_path``; yields its path."""
    path = str(tmp_path / "memcached.sock")
    command = [require_binary("memcached"), "-s", path, "-a", "0700", "-m", "16", "-t", "1"]
    if os.geteuid() == 0:
        command += ["-u", "root"]  # memcached refuses to run as root without -u
    executor = ServerProcess(command, path, name="memcached", stop_signal=MEMCACHED_STOP)
    executor.start()
    try:
        yield path
    finally:
        executor.stop()


class TestUnixSockets:
    @pytest.mark.parametrize("prefix", ["unix:", ""])
    def test_socket_location(self, unix_memcached: str, prefix: str) -> None:
        cache = configured(CLUSTER_BACKEND, prefix + unix_memcached)
        assert cache.client_servers == [unix_memcached]
        assert cache.set("over_the_socket", "yes") is True
        assert cache.get("over_the_socket") == "yes"
        direct = Client(unix_memcached, default_noreply=False)
        assert direct.get(cache.make_key("over_the_socket")) == b"yes"
        direct.close()

    def test_socket_and_tcp_together(
        self, unix_memcached: str, memcached_1: list[MemcachedServer]
    ) -> None:
        tcp = memcached_1[0]
        tcp.flush()
        cache = configured(CLUSTER_BACKEND, [tcp.spec, f"unix:{unix_memcached}"])
        ring = Continuum([tcp.spec, unix_memcached])
        direct = {tcp.spec: raw_client(tcp), unix_memcached: Client(unix_memcached)}
        keys = list(spread_keys(60))
        assert cache.set_many(dict.fromkeys(keys, "v")) == []
        owners = set()
        for key in keys:
            made = cache.make_key(key)
            owner = ring.get_node(made)
            owners.add(owner)
            holders = [node for node, client in direct.items() if client.get(made) is not None]
            assert holders == [owner]
        assert owners == {tcp.spec, unix_memcached}
        for client in direct.values():
            client.close()


# -- OPTIONS of the cluster ----------------------------------------------------------


class TestClusterOptions:
    @pytest.mark.parametrize("variant", VARIANTS)
    def test_every_ketama_variant_is_accepted(
        self, memcached_1: list[MemcachedServer], variant: str
    ) -> None:
        cache = configured(CLUSTER_BACKEND, memcached_1[0].spec, ketama=variant)
        assert cache.store.options.ketama == variant
        assert cache.set("variant", variant) is True

    def test_unknown_ketama_variant_lists_the_variants(self) -> None:
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", ketama="consistent")
        assert "'ketama'" in message
        assert "'consistent'" in message
        for variant in VARIANTS:
            assert repr(variant) in message

    def test_unknown_failover_policy_lists_the_policies(self) -> None:
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", failover="retry")
        assert "'failover'" in message
        assert "'retry'" in message
        for policy in FAILOVER_POLICIES:
            assert repr(policy) in message

    @pytest.mark.parametrize(
        ("option", "value"),
        [
            ("retry_attempts", 0),
            ("retry_attempts", 1.5),
            ("retry_attempts", "2"),
            ("retry_attempts", True),
            ("retry_timeout", -1),
            ("dead_timeout", "30"),
            ("dead_timeout", -0.5),
            ("connect_timeout", 0),
            ("timeout", -1),
            ("timeout", "1"),
            ("max_pool_size", 0),
            ("max_pool_size", 2.5),
            ("pool_idle_timeout", -1),
            ("raise_errors", "yes"),
            ("raise_errors", 1),
        ],
    )
    def test_bad_values_name_the_option(self, option: str, value: Any) -> None:
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", **{option: value})
        assert repr(option) in message
        assert repr(value) in message

    @pytest.mark.parametrize(
        "option",
        ["default_noreply", "serde", "serializer", "deserializer", "key_prefix", "ignore_exc"],
    )
    def test_reserved_pymemcache_options_are_refused(self, option: str) -> None:
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", **{option: False})
        assert repr(option) in message
        message = configuration_error(
            CLUSTER_BACKEND, "127.0.0.1:11211", client_options={option: False}
        )
        assert repr(option) in message

    def test_misspelt_option_is_refused_with_the_valid_names(self) -> None:
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", dead_timout=5)
        assert "'dead_timout'" in message
        for valid in ("dead_timeout", "ketama", "failover", "no_delay"):
            assert repr(valid) in message

    def test_valid_options_are_parsed(self, memcached_1: list[MemcachedServer]) -> None:
        cache = configured(
            CLUSTER_BACKEND,
            memcached_1[0].spec,
            failover="remap",
            retry_attempts=3,
            retry_timeout=0.5,
            dead_timeout=10,
            connect_timeout=None,
            timeout=2.5,
            max_pool_size=4,
            pool_idle_timeout=30,
            raise_errors=True,
        )
        options = cache.store.options
        assert (options.failover, options.retry_attempts, options.dead_timeout) == (
            "remap",
            3,
            10,
        )
        assert (options.connect_timeout, options.timeout, options.max_pool_size) == (None, 2.5, 4)
        assert options.raise_errors is True
        assert cache.set("configured", 1) is True

    @pytest.mark.parametrize(
        "options",
        [{"no_delay": True}, {"client_options": {"no_delay": True}}],
        ids=["top level", "client_options"],
    )
    def test_socket_options_reach_the_connections(
        self, memcached_3: list[MemcachedServer], options: dict[str, Any]
    ) -> None:
        cache = configured(CLUSTER_BACKEND, [s.spec for s in memcached_3], **options)
        cache.set_many(spread_keys())  # every server gets a pooled connection
        pooled = [client for node in cache.store._nodes.values() for client in node.pool.free]
        assert len(pooled) >= len(memcached_3)
        assert all(client.options.no_delay is True for client in pooled)

    @pytest.mark.parametrize("option", ["allow_unicode_keys", "encoding", "retry_attemps"])
    def test_other_client_arguments_are_refused_with_the_socket_options(self, option: str) -> None:
        """No pymemcache Client runs under the cluster: its other arguments mean nothing."""
        message = configuration_error(CLUSTER_BACKEND, "127.0.0.1:11211", **{option: True})
        assert repr(option) in message
        for valid in ("no_delay", "socket_keepalive", "tls_context", "retry_attempts"):
            assert repr(valid) in message

    def test_timeouts_reach_the_connections(self, memcached_1: list[MemcachedServer]) -> None:
        cache = configured(CLUSTER_BACKEND, memcached_1[0].spec, connect_timeout=0.7, timeout=1.3)
        cache.get("anything")
        (node,) = cache.store._nodes.values()
        assert [(c.options.connect_timeout, c.options.timeout) for c in node.pool.free] == [
            (0.7, 1.3)
        ]


def site_key(key: str, key_prefix: str, version: int) -> str:
    """A KEY_FUNCTION of a project's own: the site before the key (for replicate_scope)."""
    return f"site3/{key}"


class TestReplicateScope:
    """docs/configuration.md: what ``replicate_scope`` skips before the prefixes are matched."""

    SERVERS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]  # replicas() connects to none

    def cache(self, **entry: Any) -> Any:
        options = {"replicate": {"hot:": 3}, **entry.pop("OPTIONS", {})}
        setting = {"BACKEND": CLUSTER_BACKEND, "LOCATION": self.SERVERS, "OPTIONS": options}
        with override_settings(CACHES={"default": {**setting, **entry}}):
            return caches["default"]

    def copies(self, cache: Any, key: str) -> int:
        return len(cache.store.replicas(cache.make_key(key)))

    def test_the_backend_skips_key_prefix_and_version(self) -> None:
        cache = self.cache(KEY_PREFIX="shop", VERSION=7)
        assert cache.make_key("hot:front") == "shop:7:hot:front"
        assert self.copies(cache, "hot:front") == 3
        assert self.copies(cache, "cold:front") == 1

    def test_a_key_function_of_your_own_names_what_to_skip(self) -> None:
        key_function = f"{__name__}.site_key"
        assert self.copies(self.cache(KEY_FUNCTION=key_function), "hot:front") == 1
        cache = self.cache(KEY_FUNCTION=key_function, OPTIONS={"replicate_scope": r"site\d+/"})
        assert cache.make_key("hot:front") == "site3/hot:front"
        assert self.copies(cache, "hot:front") == 3
        assert self.copies(cache, "cold:front") == 1

    def test_not_a_regular_expression(self) -> None:
        with pytest.raises(ImproperlyConfigured, match="replicate_scope"):
            self.cache(OPTIONS={"replicate_scope": "site(\\d+/"}).store  # noqa: B018


# -- OPTIONS of the embedded store ----------------------------------------------------


class TestEmbeddedOptions:
    def test_defaults_need_no_location(self) -> None:
        cache = configured(EMBEDDED_BACKEND)
        cache.set("embedded", 1)
        assert cache.get("embedded") == 1

    def test_unknown_option_lists_the_valid_ones(self) -> None:
        message = configuration_error(EMBEDDED_BACKEND, "bad", MAX_ENTRIES=10)
        assert "'MAX_ENTRIES'" in message
        assert "'max_bytes'" in message
        assert "'max_item_size'" in message

    @pytest.mark.parametrize("value", [0, -1, "4096", True, 1.5, None])
    @pytest.mark.parametrize("option", ["max_bytes", "max_item_size"])
    def test_bad_values_name_the_option(self, option: str, value: Any) -> None:
        message = configuration_error(EMBEDDED_BACKEND, "bad", **{option: value})
        assert repr(option) in message or option in message
        assert repr(value) in message

    def test_memcached_limits_are_enforced_at_configuration(self) -> None:
        # memcached refuses -I below 1 KiB and -m below twice -I.
        assert "max_item_size" in configuration_error(EMBEDDED_BACKEND, "bad", max_item_size=100)
        assert "max_bytes" in configuration_error(
            EMBEDDED_BACKEND, "bad", max_item_size=4096, max_bytes=5000
        )

    def test_max_item_size(self) -> None:
        cache = configured(EMBEDDED_BACKEND, "small items", max_item_size=4096)
        assert cache.set("fits", b"x" * 3000) is True
        assert cache.get("fits") == b"x" * 3000
        assert cache.set("fits", b"x" * 5000) is False  # and the old value is gone
        assert cache.get("fits") is None
        assert cache.add("too_big", b"x" * 5000) is False
        assert cache.set_many({"ok": b"x", "too_big": b"x" * 5000}) == ["too_big"]

    def test_max_bytes_evicts_least_recently_used(self) -> None:
        cache = configured(EMBEDDED_BACKEND, "small store", max_item_size=1024, max_bytes=8192)
        cache.set("first", b"x" * 500)
        for i in range(40):
            cache.set(f"filler{i}", b"y" * 500)
            assert cache.get("first") == b"x" * 500  # reads keep it recently used
        assert cache.get("filler0") is None  # the oldest unread ones were evicted
        assert cache.get("filler39") == b"y" * 500

    def test_location_names_the_shared_store(self) -> None:
        setting = {
            "one": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-a"},
            "two": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-a", "KEY_PREFIX": "p"},
            "other": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-b"},
        }
        with override_settings(CACHES=setting):
            assert caches["one"].store is caches["two"].store
            assert caches["one"].store is not caches["other"].store
            caches["one"].set("key", "a")
            assert caches["other"].get("key") is None
            caches["other"].clear()
            assert caches["one"].get("key") == "a"

    @pytest.mark.usefixtures("reset_shared_stores")
    @pytest.mark.parametrize(
        "options",
        [
            {"serializer": "django_mcpatterns.core.serializers.JSONSerializer"},
            {"signing_key": "k" * 32},
            {"signed": True},
        ],
        ids=["serializer", "signing_key", "signed"],
    )
    def test_one_location_with_other_value_options_is_refused(
        self, options: dict[str, Any]
    ) -> None:
        setting = {
            "plain": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-c"},
            "other": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-c", "OPTIONS": options},
            "same": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": "store-c", "KEY_PREFIX": "p"},
        }
        with override_settings(CACHES=setting):
            caches["plain"].set("key", {"pickled": True})
            assert caches["same"].store is caches["plain"].store  # same options: shared
            # Sharing would read and write "other"'s values with "plain"'s serde:
            # unsigned where signing was asked for, pickled where JSON was.
            with pytest.raises(ImproperlyConfigured, match="store-c") as caught:
                caches["other"].set("key", {"json": True})
            assert "its own LOCATION" in str(caught.value)
            assert "k" * 32 not in str(caught.value)  # keys are never shown
            assert caches["plain"].get("key") == {"pickled": True}


@pytest.mark.usefixtures("reset_shared_stores")
def test_a_backend_subclass_tunes_its_sets_as_docs_sets_md_shows() -> None:
    from django_mcpatterns.backend import LocMemPatternsCache
    from django_mcpatterns.core.sets import SetOptions

    class WriteHeavySetsCache(LocMemPatternsCache):
        def _set_options(self) -> SetOptions:
            return SetOptions(compact_on_write=0.05, max_shards=1024)

    cache = WriteHeavySetsCache("tuned-sets", {})
    assert cache.sadd("tags", "a", "b") == 2
    assert cache.binding.sets.options == SetOptions(compact_on_write=0.05, max_shards=1024)
    assert LocMemPatternsCache("tuned-sets", {}).binding.sets.options.max_shards != 1024
