"""Background refreshes in a Django project: worker threads close their database connections.

A refresh that queries the database opens a connection in the runner's worker
thread, where Django's ``request_finished`` never closes it; ``refresh_runner``
closes it after the job (``close_old_connections``, ``CONN_MAX_AGE`` honoured).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.cache import caches
from django.db import connections

from django_mcpatterns import signals
from django_mcpatterns.core.refresh import RefreshQueueFull
from django_mcpatterns.core.stampede import StampedePolicy
from django_mcpatterns.counters import counters
from django_mcpatterns.refresh import refresh_runner
from tests.django.conftest import received


@pytest.mark.django_db(databases=["refresh"])
def test_a_background_refresh_closes_the_database_connection_it_opened() -> None:
    cache = caches["default"]
    cache.get_or_compute("report:db", lambda: "old", 60)
    assert cache.mark_stale("report:db")
    runner = refresh_runner(workers=1, max_queue=4)
    seen: dict[str, Any] = {}
    done = threading.Event()

    def compute() -> str:
        connection = connections["refresh"]  # this worker thread's own connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT 42")
            (answer,) = cursor.fetchone()
        seen["connection"], seen["open"] = connection, connection.connection is not None
        return f"new {answer}"

    try:
        fetched = cache.get_or_compute_result(
            "report:db", compute, 60, policy=StampedePolicy(runner=runner)
        )
        assert (fetched.value, fetched.outcome) == ("old", "stale")
        runner(done.set)  # one worker: runs after the refresh and its clean-up
        assert done.wait(10)
    finally:
        runner.shutdown()
    assert cache.get("report:db") == "new 42"
    assert seen["open"]  # the refresh did use the database from the worker thread
    assert seen["connection"].connection is None  # and its connection was closed after it


def test_a_dropped_refresh_is_signalled_counted_and_serves_stale() -> None:
    cache = caches["default"]
    cache.get_or_compute("report:dropped", lambda: "old", 60)
    assert cache.mark_stale("report:dropped")

    def full_runner(job: Any) -> None:
        raise RefreshQueueFull("100 refreshes are queued already")

    before = counters.get("refresh_dropped")
    with received(signals.refresh_dropped) as calls:
        fetched = cache.get_or_compute_result(
            "report:dropped", lambda: "never", 60, policy=StampedePolicy(runner=full_runner)
        )
    assert (fetched.value, fetched.outcome) == ("old", "stale")
    assert [call["reason"] for call in calls] == ["full"]
    assert counters.get("refresh_dropped") == before + 1  # shown on the status page
