"""Rate limits and exact counters through a real twemproxy (text mode): racing threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import caches
from django.test import override_settings

from tests.harness import Nutcracker

TEXT = {"protocol": "text", "timeout": 5}


@pytest.fixture
def cache(nutcracker: Nutcracker) -> Iterator[Any]:
    nutcracker.flush()
    backend = "django_mcpatterns.backend.KetamaMemcacheCache"
    setting = {"BACKEND": backend, "LOCATION": nutcracker.spec, "OPTIONS": dict(TEXT)}
    with override_settings(CACHES={"default": setting}):
        yield caches["default"]


def _race(work: Any, threads: int = 8) -> None:
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        work()

    running = [threading.Thread(target=run) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()


def test_racing_threads_admit_exactly_the_limit_through_twemproxy(cache: Any) -> None:
    admitted: list[int] = []
    _race(lambda: admitted.append(sum(cache.ratelimit("tw", "100/30s").allowed for _ in range(40))))
    assert sum(admitted) == 100


def test_counter_through_twemproxy(cache: Any) -> None:
    rows = [0]
    lock = threading.Lock()
    counter = cache.counter("tw-count", lambda: rows[0])

    def writes() -> None:
        for _ in range(25):
            with counter.change(+1), lock:
                rows[0] += 1
            counter.get()

    counter.get()
    _race(writes, threads=4)
    assert counter.get() == rows[0] == 100
