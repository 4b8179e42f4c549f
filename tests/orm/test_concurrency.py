"""Fills racing writes and each other, with real threads: leased, never stale, one compute."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.conf import settings
from django.db import close_old_connections
from django.test import override_settings

from django_mcpatterns.orm import cached_as, observe
from tests.orm.shop.models import Category, Product

pytestmark = pytest.mark.django_db(transaction=True)


def _thread(target: Any) -> threading.Thread:
    def run() -> None:
        try:
            target()
        finally:
            close_old_connections()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_write_during_a_fill_voids_it(shop: Any) -> None:
    c = Category.objects.create(name="c")
    p = Product.objects.create(name="p", category=c, price=1)
    computing, release = threading.Event(), threading.Event()
    calls = []

    @cached_as(Product.objects.filter(category=c))
    def prices() -> list[int]:
        seen = [x.price for x in Product.objects.filter(category=c)]
        calls.append(seen)
        if len(calls) == 1:
            computing.set()  # the rows are read: now the write lands
            assert release.wait(10)
        return seen

    reader = _thread(prices)
    assert computing.wait(10)
    p.price = 2
    p.save()  # committed and invalidated while the fill is computing
    release.set()
    reader.join(10)
    assert calls[0] == [1]  # the fill computed the old rows ...
    assert prices() == [2]  # ... and its result was void: the next read is fresh


def test_one_compute_for_concurrent_misses(shop: Any) -> None:
    c = Category.objects.create(name="c")
    Product.objects.create(name="p", category=c, price=1)
    computing, release = threading.Event(), threading.Event()
    calls = []
    results: list[Any] = []

    @cached_as(Product.objects.filter(category=c))
    def prices() -> list[int]:
        calls.append(1)
        computing.set()
        assert release.wait(10)
        return [x.price for x in Product.objects.filter(category=c)]

    with override_settings(MCPATTERNS_ORM={**settings.MCPATTERNS_ORM, "wait": 30.0}):
        first = _thread(lambda: results.append(prices()))
        assert computing.wait(10)
        second = _thread(lambda: results.append(prices()))  # finds the lease: waits
        release.set()
        first.join(30)
        second.join(30)
    assert results == [[1], [1]]
    assert len(calls) == 1
    assert observe.totals()["hit"] == 1  # the waiter was served the filler's result


def test_a_failed_compute_gives_its_lease_back(shop: Any) -> None:
    c = Category.objects.create(name="c")
    Product.objects.create(name="p", category=c, price=1)
    fail = [True]

    @cached_as(Product.objects.filter(category=c))
    def prices() -> list[int]:
        if fail[0]:
            raise RuntimeError("the database went away")
        return [x.price for x in Product.objects.filter(category=c)]

    with pytest.raises(RuntimeError):
        prices()
    fail[0] = False
    observe.reset()
    assert prices() == [1]  # filled at once: no placeholder left to wait for
    assert observe.totals()["miss"] == 1
    assert prices() == [1]
    assert observe.totals()["hit"] == 1
