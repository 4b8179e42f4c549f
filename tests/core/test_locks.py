"""Locks: the pure parts (exptimes, back-off), and threads (one Lock object, an owner per thread).

The lock's protocol, written once for both forms, is tested in
``tests/core/patterns/_async/test_locks.py`` (its sync form generated beside it);
real processes are in ``test_locks_processes.py``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import ConfigurationError, LockError, LockNotOwnedError
from django_mcpatterns.core.locks import Backoff, Lock, exptime_for
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE
from tests.core.patterns._sync import test_locks as written_once
from tests.fakes import START, near
from tests.harness import ttl_over_meta

# -- TTLs and back-off (pure) ---------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "exptime"), [(0.2, 2), (1, 2), (1.5, 3), (2, 3), (59.9, 61), (math.inf, 0)]
)
def test_exptime_keeps_an_item_at_least_the_time_asked(seconds: float, exptime: int) -> None:
    # An item with exptime e lives more than e - 1 seconds: e = ceil(seconds) + 1.
    assert exptime_for(seconds) == exptime


def test_exptime_beyond_thirty_days_is_absolute() -> None:
    seconds = MAX_RELATIVE_EXPIRE + 10
    assert exptime_for(seconds, now=START) == math.ceil(START + seconds) + 1
    with pytest.raises(ValueError, match="30-day"):
        exptime_for(seconds)


def test_backoff_grows_to_its_cap_with_jitter_in_the_upper_half() -> None:
    backoff = Backoff(initial=0.01, maximum=0.1, multiplier=2)
    low = [backoff.delay(n, lambda: 0.0) for n in range(6)]
    high = [backoff.delay(n, lambda: 1.0) for n in range(6)]
    assert high == near([0.01, 0.02, 0.04, 0.08, 0.1, 0.1])
    assert low == near([h / 2 for h in high])
    assert backoff.delay(10_000, lambda: 1.0) == near(0.1)  # no overflow


@pytest.mark.parametrize(
    "kwargs", [{"initial": 0}, {"maximum": -1}, {"initial": 1, "maximum": 0.5}, {"multiplier": 0.5}]
)
def test_backoff_validates(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        Backoff(**kwargs)


# -- one Lock object, many threads: an owner per thread --------------------------------


# One server, meta and text: the fixture of the tests written once.
cluster = written_once.cluster


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a new thread; return its result or raise its exception here."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(("ok", fn()))
        except BaseException as exc:
            result.append(("error", exc))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    kind, value = result[0]
    if kind == "error":
        raise value
    return value


def test_one_lock_object_is_one_owner_per_thread(cluster: Cluster) -> None:
    lock = Lock(cluster, "lock:shared-object", 10, blocking=False)
    assert lock.acquire()
    held = lock.token
    # Another thread is another owner: refused while held, not a LockError.
    assert in_thread(lock.acquire) is False
    assert in_thread(lambda: lock.token) is None
    assert in_thread(lock.owned) is False
    with pytest.raises(LockError, match="does not hold it"):
        in_thread(lock.release)
    assert cluster.get("lock:shared-object") == held  # still ours
    lock.release()

    def take_and_release() -> bytes | None:
        assert lock.acquire()
        token = lock.token
        lock.release()
        return token

    assert in_thread(take_and_release) not in (None, held)
    assert lock.token is None


def test_threads_sharing_one_lock_object_never_overlap(cluster: Cluster) -> None:
    lock = Lock(cluster, "lock:critical", 10, backoff=Backoff(initial=0.001, maximum=0.01))
    inside: list[int] = []
    overlaps: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                with lock:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(len(inside))
                    time.sleep(0.001)
                    inside.pop()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert overlaps == []
    assert cluster.get("lock:critical") is None


def test_a_helper_thread_extends_and_releases_with_the_owners_token(cluster: Cluster) -> None:
    lock = Lock(cluster, "lock:handed-over", 10)
    assert lock.acquire()
    token = lock.token
    assert token is not None
    in_thread(lambda: lock.extend(20, replace_ttl=True, token=token))
    assert 18 <= (ttl_over_meta(cluster, "lock:handed-over") or 0) <= 22
    in_thread(lambda: lock.release(token=token))
    assert cluster.get("lock:handed-over") is None
    with pytest.raises(LockNotOwnedError):
        lock.release()  # the owner thread learns it is gone
