"""The package's jitter never moves the application's ``random``, and forked children differ."""

from __future__ import annotations

import multiprocessing
import random

from django_mcpatterns.core import chance
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import free_port


def test_a_dead_servers_retries_leave_the_applications_random_alone() -> None:
    # Each failure draws the health rules' jitter; an application that seeded
    # ``random`` for a repeatable run must see the same numbers anyway.
    dead = f"127.0.0.1:{free_port()}"
    cluster = Cluster([dead], ClusterOptions(connect_timeout=0.2, retry_attempts=1))
    random.seed(1234)
    before = random.getstate()
    try:
        for _ in range(5):
            assert cluster.get("k") is None
    finally:
        cluster.close()
    assert random.getstate() == before


def _draw(queue: multiprocessing.Queue) -> None:
    queue.put(chance.uniform())


def test_forked_children_do_not_draw_the_same_jitter() -> None:
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue = context.Queue()
    children = [context.Process(target=_draw, args=(queue,)) for _ in range(3)]
    for child in children:
        child.start()
    draws = {queue.get(timeout=60) for _ in children}
    for child in children:
        child.join(60)
    assert len(draws) == 3  # reseeded after fork: three independent floats
