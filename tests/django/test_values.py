"""Issue 17 on Django's cache API: compression, large values, long keys, bump, zero-byte values.

Every test runs on a real memcached cluster and on the embedded store, built
through ``settings.CACHES`` as a project builds them.
"""

from __future__ import annotations

import asyncio
import os
import pickle
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheKey
from django.test import override_settings

from django_mcpatterns.checks import check_caches
from django_mcpatterns.core.keys import MAX_KEY_LENGTH
from tests.django.conftest import CLUSTER_BACKEND, EMBEDDED_BACKEND, Deployment
from tests.harness import MemcachedServer, raw_client

pytestmark = pytest.mark.usefixtures("reset_shared_stores")

BIG = os.urandom(2 * 1024 * 1024 + 5)  # over memcached's 1 MiB item limit
ROWS = {"rows": [{"id": i, "name": f"user {i}", "mail": f"u{i}@x.org"} for i in range(3000)]}
LONG = "report:" + "/section" * 60  # 487 characters


@pytest.fixture(params=["cluster", "embedded"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    if request.param == "embedded":
        return Deployment.embedded("values")
    servers = request.getfixturevalue("memcached_3")
    deployment = Deployment.cluster(servers)
    deployment.flush()
    return deployment


def cache_with(deployment: Deployment, **options: Any) -> Any:
    entry = deployment.params()
    entry["OPTIONS"] = {**entry.get("OPTIONS", {}), **options}
    if deployment.backend == EMBEDDED_BACKEND:
        entry["LOCATION"] = f"values-{sorted(options.items())!r}"  # options differ: own store
    with override_settings(CACHES={"default": entry}):
        cache = caches["default"]
    cache.clear()
    return cache


def stored_size(deployment: Deployment, made_key: str) -> int:
    """Bytes the item of ``made_key`` holds in memcached (mg s), on whichever server has it."""
    for server in deployment.require_servers():
        line = raw_client(server).raw_command(b"mg " + made_key.encode() + b" s", b"\r\n")
        if line.startswith(b"HD"):
            return int(line.split()[1][1:])
    raise AssertionError(f"{made_key!r} is on no server")


# -- compression ----------------------------------------------------------------------


def test_compressed_values_take_under_30_percent(deployment: Deployment) -> None:
    cache = cache_with(deployment, compressor="zlib", compress_min_len=1024)
    cache.set("rows", ROWS)
    assert cache.get("rows") == ROWS
    if deployment.has_servers:
        plain = len(pickle.dumps(ROWS, pickle.HIGHEST_PROTOCOL))
        assert stored_size(deployment, cache.make_key("rows")) < 0.3 * plain


def test_a_pylibmc_cache_and_ours_share_compressed_values(
    memcached_3: list[MemcachedServer],
) -> None:
    """A migration from PyLibMCCache: both caches read what the other compressed."""
    pytest.importorskip("pylibmc")
    deployment = Deployment.cluster(memcached_3)
    deployment.flush()
    pylibmc_entry = {
        "BACKEND": "django.core.cache.backends.memcached.PyLibMCCache",
        "LOCATION": [s.spec for s in memcached_3],
        "OPTIONS": {"behaviors": {"ketama_weighted": True}},
    }
    ours_entry = {**deployment.params(), "OPTIONS": {"compress_min_len": 1024}}
    with override_settings(CACHES={"default": ours_entry, "old": pylibmc_entry}):
        ours, old = caches["default"], caches["old"]
        old._cache.set(old.make_key("from-old"), ROWS, min_compress_len=100)  # compressed
        ours.set("from-ours", ROWS)
        assert ours.get("from-old") == ROWS
        assert old.get("from-ours") == ROWS


# -- large values ---------------------------------------------------------------------


def test_by_default_a_value_over_the_limit_is_not_cached_and_the_old_one_goes(
    deployment: Deployment,
) -> None:
    cache = cache_with(deployment)
    cache.set("big", "old value")
    assert cache.set("big", BIG) is False  # Django's contract, as its memcached backends
    assert cache.get("big") is None


def test_chunk_mode_caches_values_over_the_limit(deployment: Deployment) -> None:
    cache = cache_with(deployment, large_values="chunk")
    assert cache.set("big", BIG)
    assert cache.get("big") == BIG
    assert cache.has_key("big")
    assert cache.get_many(["big", "absent"]) == {"big": BIG}
    assert cache.add("big", b"other") is False
    assert cache.set_many({"big2": BIG[::-1], "small": 1}) == []
    assert cache.get_or_set("big2", "unused") == BIG[::-1]
    assert asyncio.run(cache.aget("big")) == BIG
    cache.delete("big")
    assert cache.get("big") is None


def test_chunk_mode_holds_on_the_native_async_api(deployment: Deployment) -> None:
    """The a-methods run on the async store, chunked the same way: each form reads the other's."""
    cache = cache_with(deployment, large_values="chunk")

    async def scenario() -> None:
        assert await cache.aset("big", BIG)
        assert await cache.aadd("big", b"other") is False
        assert await cache.aset_many({"big2": BIG[::-1], "small": 1}) == []
        assert await cache.aget_many(["big", "big2", "absent"]) == {"big": BIG, "big2": BIG[::-1]}
        assert await cache.aget_or_set("big2", "unused") == BIG[::-1]
        assert await cache.ahas_key("big")

    asyncio.run(scenario())
    assert cache.get("big") == BIG
    cache.set("big3", BIG)
    assert asyncio.run(cache.aget("big3")) == BIG
    asyncio.run(cache.adelete("big3"))
    assert cache.get("big3") is None


# -- long keys ------------------------------------------------------------------------


def test_long_keys_are_refused_by_default(deployment: Deployment) -> None:
    cache = cache_with(deployment)
    with pytest.raises(InvalidCacheKey):
        cache.set(LONG, 1)


def test_long_keys_hash_into_a_readable_stable_form(deployment: Deployment) -> None:
    cache = cache_with(deployment, long_keys="hash")
    made = cache.make_and_validate_key(LONG)
    assert len(made.encode()) <= MAX_KEY_LENGTH
    assert made.startswith(cache.make_key(LONG)[:100])  # readable head
    assert made == cache_with(deployment, long_keys="hash").make_and_validate_key(LONG)
    assert cache.make_and_validate_key("short") == cache.make_key("short")
    assert cache.set(LONG, "value")
    assert cache.get(LONG) == "value"
    assert cache.get(LONG + "x") is None  # another long key, another digest
    assert cache.sadd(LONG, "member") == 1  # the patterns make keys the same way
    with pytest.raises(InvalidCacheKey):
        cache.set("with space", 1)  # only the length is forgiven


def test_long_names_hash_for_every_pattern(deployment: Deployment) -> None:
    """Rate limits and counters add suffixes to the made key: those fit too (issue 23)."""
    cache = cache_with(deployment, long_keys="hash")
    assert [cache.ratelimit(LONG, "3/m").allowed for _ in range(4)] == [True] * 3 + [False]
    assert asyncio.run(cache.aratelimit(LONG + "a", "1/m")).allowed
    rows = [1, 2, 3]
    counter = cache.counter(LONG, lambda: len(rows))
    assert counter.get() == 3
    with counter.change(+1):
        rows.append(4)
    assert counter.get() == 4
    assert asyncio.run(cache.counter(LONG + "b", lambda: 7).aget()) == 7


@pytest.mark.parametrize("hashing", ["refuse", "hash"])
def test_made_keys_up_to_250_bytes_work_for_every_pattern(
    deployment: Deployment, hashing: str
) -> None:
    """A valid made key of 242-250 bytes is a valid name for rate limits and counters."""
    cache = cache_with(deployment, long_keys=hashing)
    for size in (242, 246, 250):
        name = "n" * (size - len(cache.make_key("")))
        assert len(cache.make_key(name).encode()) == size
        assert cache.ratelimit(name, "2/m").allowed
        assert asyncio.run(cache.aratelimit(name, "2/m")).allowed
        assert not cache.ratelimit(name, "2/m").allowed
        assert cache.counter(name, lambda: 5).get() == 5


def test_a_key_spelled_like_a_digest_form_is_not_the_long_key(deployment: Deployment) -> None:
    """The digest key space is disjoint from the keys a caller can give (issue 23)."""
    cache = cache_with(deployment, long_keys="hash")
    digest_form = cache.make_and_validate_key(LONG)
    spoof = digest_form[len(cache.make_key("")) :]  # the key whose made key spells it
    assert cache.make_key(spoof) == digest_form
    assert cache.set(LONG, "long value")
    assert cache.get(spoof) is None
    assert cache.set(spoof, "spoof value")
    assert cache.get(LONG) == "long value"
    assert cache.get(spoof) == "spoof value"


# -- bump -----------------------------------------------------------------------------


def test_bump_says_whether_the_key_is_there(deployment: Deployment) -> None:
    cache = cache_with(deployment)
    cache.set("here", "v", 300)
    assert cache.bump("here") is True
    assert cache.bump("absent") is False
    assert cache.get("absent") is None  # bump never creates
    assert asyncio.run(cache.abump("here")) is True
    assert asyncio.run(cache.abump("absent")) is False
    if deployment.has_servers:
        ttl = deployment.ttl(cache.make_key("here"))
        assert ttl is not None
        assert 290 <= ttl <= 300  # its TTL untouched
    with pytest.raises(InvalidCacheKey):
        cache.bump("with space")


# -- zero-byte values -----------------------------------------------------------------


@pytest.mark.parametrize("value", [b"", ""], ids=["bytes", "str"])
def test_zero_byte_values_are_hits(deployment: Deployment, value: Any) -> None:
    cache = cache_with(deployment)
    cache.set("empty", value)
    assert cache.get("empty", "miss") == value
    assert cache.has_key("empty")
    assert cache.get_or_set("empty", "recomputed") == value
    assert cache.get_many(["empty"]) == {"empty": value}


# -- checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"compressor": "brotli"},
        {"compress_min_len": -5},
        {"large_values": "split"},
        {"long_keys": "truncate"},
    ],
)
@pytest.mark.parametrize("backend", [CLUSTER_BACKEND, EMBEDDED_BACKEND])
def test_bad_value_options_are_e005(options: dict[str, Any], backend: str) -> None:
    entry = {"BACKEND": backend, "LOCATION": "127.0.0.1:11211", "OPTIONS": options}
    with override_settings(CACHES={"default": entry}):
        (error,) = check_caches(None)
    assert error.id == "mcpatterns.E005"
    assert repr(next(iter(options))) in error.msg
