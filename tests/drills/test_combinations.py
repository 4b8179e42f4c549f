"""The cache contract under combinations of options (issue 23, item 9).

Each option is tested alone elsewhere; the defects that reached users sat
where two met (``replicate`` with ``large_values="chunk"``: chunks on the home
only, a manifest on copies before its chunks).  Here one scenario of the
Django cache API runs through a cache built from a combination of options,
sync and then async, on real servers (three and a gutter), and ends by
killing the server that holds a replicated value: every answer must be what
the options promise, and a dead server's keys read as misses, never as an
error or a wrong value.

Every run covers every pair of option values (a pairwise-covering set, made
here deterministically); wider draws of whole combinations run under the
``slow`` marker with hypothesis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheKey
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_mcpatterns.core.options import ClusterOptions
from tests.django.test_backend_contract import Point
from tests.harness import MemcachedServer, memcached_cluster, servers_holding

Options = dict[str, Any]

#: Each option and the values combined; the first is the default.
DIMENSIONS: dict[str, list[Any]] = {
    "protocol": ["meta", "text"],
    "replicate": [False, True],
    "failover": ["miss", "remap", "gutter"],
    "large_values": ["refuse", "chunk"],
    "compressor": [None, "zlib"],
    "long_keys": ["refuse", "hash"],
    "signed": [False, True],
}
if "on_outage" in {f.name for f in dataclasses.fields(ClusterOptions)}:
    DIMENSIONS["on_outage"] = ["degrade", "raise"]

BIG = random.Random(23).randbytes(1_500_000)  # over memcached's 1 MiB item limit
LONG = "r:" + "k" * 300  # over memcached's 250-byte key limit


def pairwise(dimensions: dict[str, list[Any]]) -> list[Options]:
    """A small set of combinations in which every pair of values of two options meets.

    Greedy and deterministic: each row starts from the first pair not yet
    covered and takes, option by option, the value that covers most new pairs.
    """
    names = list(dimensions)
    uncovered = {
        ((a, va), (b, vb))
        for a, b in itertools.combinations(names, 2)
        for va in range(len(dimensions[a]))
        for vb in range(len(dimensions[b]))
    }
    rows: list[Options] = []
    while uncovered:
        (a, va), (b, vb) = min(uncovered, key=lambda p: (names.index(p[0][0]), p))
        row = {a: va, b: vb}
        for name in names:
            if name not in row:
                row[name] = _best(name, len(dimensions[name]), row, uncovered)
        uncovered -= {((x, row[x]), (y, row[y])) for x, y in itertools.combinations(names, 2)}
        rows.append({name: dimensions[name][row[name]] for name in names})
    return rows


def _best(name: str, count: int, row: dict[str, int], uncovered: set[Any]) -> int:
    """The value of option ``name`` that meets most pairs not yet covered with ``row``."""

    def gain(v: int) -> int:
        return sum(((n, row[n]), (name, v)) in uncovered for n in row) + sum(
            ((name, v), (n, row[n])) in uncovered for n in row
        )

    return max(range(count), key=lambda v: (gain(v), -v))


def label(combination: Options) -> str:
    return (
        "-".join(
            f"{name}={value}" for name, value in combination.items() if value != DIMENSIONS[name][0]
        )
        or "defaults"
    )


def cache_options(combination: Options, gutter: MemcachedServer) -> Options:
    options: Options = {
        "protocol": combination["protocol"],
        "failover": combination["failover"],
        "large_values": combination["large_values"],
        "long_keys": combination["long_keys"],
    }
    if combination["replicate"]:
        options["replicate"] = {"r:": 2}
    if combination["failover"] == "gutter":
        options["gutter"] = [gutter.spec]
    if combination["compressor"]:
        options["compressor"] = combination["compressor"]
    if combination["signed"]:
        options["signing_key"] = "s" * 32
    if "on_outage" in combination:
        options["on_outage"] = combination["on_outage"]
    return options


# -- the scenario: (method, args, what the options promise) ---------------------------

Step = tuple[str, tuple[Any, ...], Callable[[Options], Any]]


def same(value: Any) -> Callable[[Options], Any]:
    return lambda _: value


def long_key(value: Any) -> Callable[[Options], Any]:
    return lambda o: value if o["long_keys"] == "hash" else InvalidCacheKey


def computed() -> str:
    return "computed"


def big_value(stored: Any, refused: Any) -> Callable[[Options], Any]:
    return lambda o: stored if o["large_values"] == "chunk" else refused


SCENARIO: list[Step] = [
    ("get", ("r:a",), same(None)),
    ("set", ("r:a", "text"), same(True)),
    ("get", ("r:a",), same("text")),
    ("set", ("p:a", Point(1, 2)), same(True)),
    ("get", ("p:a",), same(Point(1, 2))),
    ("add", ("r:a", "other"), same(False)),
    ("add", ("r:b", 0), same(True)),
    ("get", ("r:b", "default"), same(0)),
    ("set_many", ({"r:c": 1, "p:c": b"bytes", "p:d": None},), same([])),
    (
        "get_many",
        (["r:a", "r:c", "p:c", "p:d", "p:missing"],),
        same({"r:a": "text", "r:c": 1, "p:c": b"bytes", "p:d": None}),
    ),
    ("set", ("p:n", 10), same(True)),
    ("incr", ("p:n", 5), same(15)),
    ("decr", ("p:n",), same(14)),
    ("touch", ("r:a", 100), same(True)),
    ("has_key", ("r:a",), same(True)),
    ("has_key", ("p:missing",), same(False)),
    ("delete", ("r:c",), same(True)),
    ("get", ("r:c",), same(None)),
    ("delete_many", (["r:b", "p:c"],), same(None)),
    ("get_many", (["r:b", "p:c"],), same({})),
    ("set", (LONG, "long"), long_key(True)),
    ("get", (LONG,), long_key("long")),
    ("set", ("r:big", BIG), big_value(True, False)),
    ("get", ("r:big",), big_value(BIG, None)),
    ("set_many", ({"p:big": BIG, "p:small": "s"},), big_value([], ["p:big"])),
    (
        "get_many",
        (["p:big", "p:small"],),
        big_value({"p:big": BIG, "p:small": "s"}, {"p:small": "s"}),
    ),
    ("set", ("r:big", BIG * 2), big_value(True, False)),  # replaced by a larger value: more chunks
    ("get", ("r:big",), big_value(BIG * 2, None)),
    # Patterns, whose keys add suffixes to the caller's (outside the replicated prefix).
    ("get_or_compute", ("p:gc", computed, 60), same("computed")),
    ("get_or_compute", ("p:" + "g" * 300, computed, 60), long_key("computed")),
    ("sadd", ("p:set", "a", "b"), same(2)),
    ("smembers", ("p:set",), same({"a", "b"})),
    ("ratelimit", ("p:" + "l" * 240, "5/m"), same(True)),  # made keys near 250 bytes
    ("ratelimit", ("p:" + "l" * 300, "5/m"), long_key(True)),
]

#: Read after a server holding ``r:big`` is killed, with what was last written.
HELD: dict[str, Any] = {"r:a": "text", "p:a": Point(1, 2), "p:n": 14, "r:big": BIG * 2}


def answer(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except InvalidCacheKey:
        return InvalidCacheKey


async def aanswer(call: Callable[[], Any]) -> Any:
    try:
        return await call()
    except InvalidCacheKey:
        return InvalidCacheKey


def run(cache: Any, combination: Options, form: str) -> list[tuple[str, Any, str]]:
    """The scenario's answers that differ from what the options promise."""
    wrong: list[tuple[str, Any, str]] = []

    def judge(method: str, args: tuple[Any, ...], expected: Any, got: Any) -> None:
        if method == "ratelimit" and got is not InvalidCacheKey:
            got = got.allowed  # a Decision: whether the attempt was admitted
        if got != expected(combination):
            wrong.append((method, args[0] if args else None, repr(got)[:40]))

    if form == "sync":
        for method, args, expected in SCENARIO:
            judge(method, args, expected, answer(partial(getattr(cache, method), *args)))
        return wrong

    async def steps() -> None:
        for method, args, expected in SCENARIO:
            call = partial(getattr(cache, "a" + method), *args)
            judge(method, args, expected, await aanswer(call))

    asyncio.run(steps())
    return wrong


def promised_after(
    combination: Options, holders: dict[str, list[str]], lost: str
) -> dict[str, Any]:
    """What each key reads once server ``lost`` holds nothing: its value where another
    server holds it (a replicated one on a copy), else a miss."""
    kept = {}
    for key, value in HELD.items():
        if key == "r:big" and combination["large_values"] != "chunk":
            continue  # never stored
        if any(spec != lost for spec in holders[key]):
            kept[key] = value
    return kept


def reads(cache: Any, promised: dict[str, Any], combination: Options) -> None:
    """get_many (a few times: each picks a copy at random), get and aget_many read ``promised``."""
    for _ in range(4):
        assert cache.get_many(list(HELD)) == promised, combination
    assert {k: v for k in HELD if (v := cache.get(k)) is not None} == promised, combination

    async def areads() -> list[dict[str, Any]]:
        return [await cache.aget_many(list(HELD)) for _ in range(4)]

    assert asyncio.run(areads()) == [promised] * 4, combination


@pytest.fixture
def servers() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(4) as started:  # three, and a gutter
        yield started


def check(combination: Options, servers: list[MemcachedServer]) -> None:
    from django_mcpatterns.core.cluster import reset_shared_clusters

    *ring, gutter = servers
    entry = {
        "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
        "LOCATION": [s.spec for s in ring],
        "OPTIONS": cache_options(combination, gutter),
    }
    try:
        with override_settings(CACHES={"default": entry}):
            cache = caches["default"]
            for form in ("sync", "async"):
                for server in servers:
                    server.flush()
                assert run(cache, combination, form) == [], (form, combination)
            made = {key: cache.make_key(key) for key in HELD}
            holders = {key: servers_holding(ring, made[key]) for key in HELD}
            if combination["replicate"]:
                assert len(holders["r:a"]) == 2, holders
            # A server restarted empty: a replicated key's copy answers "miss" there.
            emptied = holders["r:a"][0]
            next(s for s in ring if s.spec == emptied).flush()
            reads(cache, promised_after(combination, holders, emptied), combination)
            # A server killed: the one holding the large value (its chunks too).
            holders = {key: servers_holding(ring, made[key]) for key in HELD}
            held = [specs[0] for specs in holders.values() if specs]
            dead = holders["r:big"][0] if holders["r:big"] else (held or [ring[0].spec])[0]
            next(s for s in ring if s.spec == dead).kill()
            reads(cache, promised_after(combination, holders, dead), combination)
    finally:
        reset_shared_clusters()


PAIRWISE = pairwise(DIMENSIONS)


@pytest.mark.parametrize("combination", PAIRWISE, ids=[label(c) for c in PAIRWISE])
def test_every_pair_of_options_keeps_the_cache_contract(
    combination: Options, servers: list[MemcachedServer]
) -> None:
    check(combination, servers)


def test_the_pairwise_set_covers_every_pair() -> None:
    for a, b in itertools.combinations(DIMENSIONS, 2):
        met = {(row[a], row[b]) for row in PAIRWISE}
        assert met == set(itertools.product(DIMENSIONS[a], DIMENSIONS[b])), (a, b)
    assert len(PAIRWISE) <= 10


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.fixed_dictionaries({name: st.sampled_from(values) for name, values in DIMENSIONS.items()})
)
def test_drawn_combinations_keep_the_cache_contract(combination: Options) -> None:
    with memcached_cluster(4) as servers:
        check(combination, servers)
