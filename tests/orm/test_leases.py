"""Leased fills: what a miss costs on the wire, and who computes when misses race.

With memcached's own leases (``lease="meta"``, the default) the read takes the
lease of a missing result in its own round trip (``mg <key> v c f N<ttl>``): a
cold miss is the read and the fill.  A result found invalid after a write is
replaced by a lease in one write (``md C<cas>`` then ``mg N``), so its readers
wait for one fill.  Text mode leases with a placeholder, as before.  Round
trips are counted on the wire (:class:`tests.drills.proxy.Proxy`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import caches
from django.db import close_old_connections
from django.test import override_settings

from django_mcpatterns.orm import cached_as, observe
from tests.django.conftest import CLUSTER_BACKEND
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["meta", "text"])
def wire(
    request: pytest.FixtureRequest, orm_hooks: None, memcached_1: list[MemcachedServer]
) -> Iterator[tuple[Proxy, str]]:
    """The ORM cache on one memcached behind a recording proxy, in each protocol."""
    memcached_1[0].flush()
    with (
        Proxy(memcached_1[0].port) as proxy,
        override_settings(
            CACHES={
                "default": {
                    "BACKEND": CLUSTER_BACKEND,
                    "LOCATION": [proxy.spec],
                    "OPTIONS": {"protocol": request.param},
                }
            },
            MCPATTERNS_ORM={"cache": "default"},
        ),
    ):
        caches["default"].clear()
        observe.reset()
        yield proxy, request.param


def trips(proxy: Proxy, read: Callable[[], object]) -> int:
    proxy.forget()
    read()
    return proxy.round_trips


def test_round_trips_per_read(wire: tuple[Proxy, str]) -> None:
    proxy, protocol = wire
    c = Category.objects.create(name="c")
    p = Product.objects.create(name="p", category=c, price=1)
    by_price = Product.objects.filter(category=c).order_by("-price")
    list(Product.objects.filter(category=c).cache())  # its stamps and scheme exist from here on
    cold = trips(proxy, lambda: list(by_price.cache()))  # a result never read: the same stamps
    warm = trips(proxy, lambda: list(by_price.cache()))
    p.price = 2
    p.save()
    invalidated = trips(proxy, lambda: list(by_price.cache()))
    assert [x.price for x in by_price.cache()] == [2]
    assert observe.totals()["miss"] == 3
    assert warm == 1  # the result and its stamps in one pipelined multi-get
    if protocol == "meta":
        assert (cold, invalidated) == (2, 3)  # the read took the lease; a stale one is replaced
    else:
        assert (cold, invalidated) == (3, 3)  # the read, the placeholder's add or swap, the fill


def test_lease_cas_costs_the_read_and_the_fill(wire: tuple[Proxy, str]) -> None:
    proxy, _ = wire
    c = Category.objects.create(name="c")
    Product.objects.create(name="p", category=c, price=1)
    list(Product.objects.filter(category=c).cache())
    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "lease": "cas"}):
        cold = trips(proxy, lambda: list(Product.objects.filter(category=c).reverse().cache()))
    assert cold == 2


def _thread(target: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            close_old_connections()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_concurrent_misses_of_an_invalidated_result_compute_once(shop: Any) -> None:
    c = Category.objects.create(name="c")
    p = Product.objects.create(name="p", category=c, price=1)
    computing, release = threading.Event(), threading.Event()
    calls: list[int] = []
    block = [False]
    results: list[Any] = []

    @cached_as(Product.objects.filter(category=c))
    def prices() -> list[int]:
        calls.append(1)
        if block[0]:
            computing.set()
            assert release.wait(10)
        return [x.price for x in Product.objects.filter(category=c)]

    assert prices() == [1]
    p.price = 2
    p.save()  # the cached result is there, and void
    block[0] = True
    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "wait": 30.0}):
        first = _thread(lambda: results.append(prices()))
        assert computing.wait(10)
        second = _thread(lambda: results.append(prices()))  # finds the lease: waits
        release.set()
        first.join(30)
        second.join(30)
    assert results == [[2], [2]]
    assert len(calls) == 2  # the first fill, and one for both misses after the write
    assert observe.totals()["stale"] == 0


def test_a_waiter_takes_over_a_lease_given_back(shop: Any) -> None:
    c = Category.objects.create(name="c")
    Product.objects.create(name="p", category=c, price=1)
    computing, release = threading.Event(), threading.Event()
    calls: list[str] = []
    outcomes: list[Any] = []

    @cached_as(Product.objects.filter(category=c))
    def prices() -> list[int]:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            computing.set()
            assert release.wait(10)
            raise RuntimeError("the database went away")
        return [x.price for x in Product.objects.filter(category=c)]

    def attempt() -> None:
        try:
            outcomes.append(prices())
        except RuntimeError as exc:
            outcomes.append(exc)

    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "wait": 30.0}):
        first = _thread(attempt)
        assert computing.wait(10)
        second = _thread(attempt)  # waits for the first fill ...
        release.set()  # ... which fails and gives its lease back: the waiter fills
        first.join(30)
        second.join(30)
    assert [type(o) for o in outcomes] == [RuntimeError, list]
    assert outcomes[1] == [1]
    assert len(calls) == 2
    observe.reset()
    assert prices() == [1]  # the waiter's fill landed
    assert observe.totals()["hit"] == 1
