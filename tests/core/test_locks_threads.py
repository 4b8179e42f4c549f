"""Locks and threads: one Lock object keeps an owner per thread (a sync form's own).

The lock's protocol, written once for both forms, is tested in
``tests/core/patterns/_async/test_locks.py`` (its sync form generated beside it);
real processes are in ``test_locks_processes.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import LockError, LockNotOwnedError
from django_mcpatterns.core.locks import Backoff, Lock
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.harness import MemcachedServer, ttl_over_meta


@pytest.fixture(params=["meta", "text"])
def cluster(
    memcached_1: list[MemcachedServer], request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=request.param))
    yield cluster
    cluster.close()


# -- one Lock object, many threads: an owner per thread --------------------------------


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
