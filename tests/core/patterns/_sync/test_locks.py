# Generated from tests/core/patterns/_async/test_locks.py by scripts/generate_sync.py: do not edit.
"""Locks, written once: the protocol on a fake clock, then on real memcached.

This asyncio source is the test of both forms: scripts/generate_sync.py makes
``../_sync/test_locks.py`` (``AsyncLock`` -> ``Lock``, ``await`` dropped).  Timing
rules (TTLs, back-off, blocking timeouts) run on the embedded store with one fake
clock shared by the store and the lock, whose sleep advances it: deterministic and
instant.  What only memcached decides (``cas`` with a negative exptime deleting,
refused connections) runs on real servers.  What one form alone has stays
hand-written: the pure parts and threads in ``tests/core/test_locks.py``, tasks and cancellation in
``tests/core/test_locks_async.py``, real processes in ``tests/core/test_locks_processes.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.concurrency import sleep
from django_mcpatterns.core.exceptions import (
    ConfigurationError,
    InvalidKeyError,
    LockError,
    LockNotOwnedError,
    LockTimeoutError,
    NodeUnavailableError,
)
from django_mcpatterns.core.locks import (
    Backoff,
    Lock,
    LockTimedOut,
    LockWaited,
    authoritative,
)
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.store import MAX_RELATIVE_EXPIRE
from tests.conftest import flush
from tests.fakes import FakeClock, Hooked, near
from tests.harness import MemcachedServer, free_port, ttl_over_meta
from tests.twins import face


@pytest.fixture
def make_lock(store: MemoryStore, clock: FakeClock, events: list[object]) -> Callable[..., Lock]:
    def make(key: str = "lock:report", timeout: float = 10, **kwargs: Any) -> Lock:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("sleep", clock.sleep)
        kwargs.setdefault("rng", lambda: 0.5)
        kwargs.setdefault("on_event", events.append)
        backend = kwargs.pop("store", None)
        return Lock(face(store) if backend is None else backend, key, timeout, **kwargs)

    return make


# -- acquire, release, ownership ---------------------------------------------------


def test_acquire_and_release(make_lock: Callable[..., Lock], store: MemoryStore) -> None:
    lock = make_lock()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked()
    assert lock.owned()
    assert store.get("lock:report") == lock.token  # the token, readable by any client
    lock.release()
    assert not lock.locked()
    assert not lock.owned()
    assert lock.token is None


def test_a_held_lock_is_refused_to_another_owner(
    make_lock: Callable[..., Lock],
) -> None:
    first, second = make_lock(), make_lock()
    assert first.acquire()
    assert second.acquire(blocking=False) is False
    assert second.locked()
    assert not second.owned()
    first.release()
    assert second.acquire(blocking=False) is True


def test_each_acquisition_draws_a_new_token(make_lock: Callable[..., Lock]) -> None:
    lock = make_lock()
    tokens = set()
    for _ in range(3):
        lock.acquire()
        tokens.add(lock.token)
        lock.release()
    assert len(tokens) == 3
    assert all(isinstance(t, bytes) and len(t) == 32 for t in tokens)


def test_locks_are_not_reentrant(make_lock: Callable[..., Lock]) -> None:
    lock = make_lock()
    lock.acquire()
    with pytest.raises(LockError, match="already held by this Lock object"):
        lock.acquire()


def test_releasing_a_lock_never_acquired_is_a_lock_error(
    make_lock: Callable[..., Lock],
) -> None:
    with pytest.raises(LockError, match="does not hold it") as caught:
        make_lock().release()
    assert not isinstance(caught.value, LockNotOwnedError)


# -- TTLs on memcached's whole-second clock ----------------------------------------


@pytest.mark.parametrize("offset", [0.0, 0.3, 0.99])
@pytest.mark.parametrize("timeout", [1, 2.5])
def test_a_lock_is_held_at_least_its_timeout_and_freed_after_ceil_plus_one(
    make_lock: Callable[..., Lock], clock: FakeClock, offset: float, timeout: float
) -> None:
    clock.advance(offset)
    holder, other = make_lock(timeout=timeout), make_lock()
    taken_at = clock()
    holder.acquire()
    clock.now = taken_at + timeout - 0.001
    assert not other.acquire(blocking=False)
    clock.now = taken_at + math.ceil(timeout) + 1
    assert other.acquire(blocking=False)  # a crashed holder never wedges the lock


@pytest.mark.parametrize("timeout", [None, 0, -1, math.nan, "10", True, MAX_RELATIVE_EXPIRE])
def test_every_lock_has_a_valid_ttl(store: MemoryStore, timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="lock timeout"):
        Lock(face(store), "k", timeout)


def test_an_invalid_key_fails_when_the_lock_is_made(store: MemoryStore) -> None:
    with pytest.raises(InvalidKeyError):
        Lock(face(store), "has space", 10)


# -- losing the lock ----------------------------------------------------------------


def test_a_late_release_does_not_delete_the_new_owners_lock(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    late, new = make_lock(timeout=1), make_lock(timeout=10)
    late.acquire()
    clock.advance(3)  # late's TTL lapses
    assert new.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError, match="another owner may hold it now"):
        late.release()
    assert new.owned()
    assert late.token is None


def test_releasing_a_lapsed_lock_nobody_took_raises(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    lock = make_lock(timeout=1)
    lock.acquire()
    clock.advance(3)
    with pytest.raises(LockNotOwnedError, match="nobody holds it now"):
        lock.release()


def test_a_takeover_before_the_release_is_detected(
    clock: FakeClock, store: MemoryStore, make_lock: Callable[..., Lock]
) -> None:
    hooked = Hooked(face(store))
    # One owner for every task (thread): the hook takes over inside the release, which
    # asyncio finishes in a task of its own.
    late, new = make_lock(store=hooked, timeout=1), make_lock(thread_local=False)

    def lapse_and_take_over(*args: Any) -> None:
        clock.advance(3)
        assert new.acquire(blocking=False)

    late.acquire()
    hooked.before["delete_cas"] = lapse_and_take_over  # the new owner's item has a new cas
    with pytest.raises(LockNotOwnedError, match="another owner may hold it"):
        late.release()
    assert new.owned()


def test_a_takeover_between_gets_and_cas_of_a_release_by_token_is_detected(
    clock: FakeClock, store: MemoryStore, make_lock: Callable[..., Lock]
) -> None:
    hooked = Hooked(face(store))
    late, helper = make_lock(timeout=1), make_lock(store=hooked)
    new = make_lock(thread_local=False)  # one owner for every task: the hook is in the release

    def lapse_and_take_over(*args: Any) -> None:
        clock.advance(3)
        assert new.acquire(blocking=False)

    late.acquire()
    hooked.before["cas"] = lapse_and_take_over  # after the helper's gets saw the token
    with pytest.raises(LockNotOwnedError):
        helper.release(token=late.token)  # the helper does not know the cas: by the token
    assert new.owned()


def test_release_deletes_only_the_version_acquire_stored(
    store: MemoryStore, make_lock: Callable[..., Lock]
) -> None:
    hooked = Hooked(face(store))
    lock = make_lock(store=hooked)
    lock.acquire()
    lock.extend(5)
    lock.release()
    assert [name for name, _ in hooked.calls] == ["add_cas", "recas", "delete_cas"]


def test_release_after_a_helper_extended_goes_by_the_token(
    store: MemoryStore, make_lock: Callable[..., Lock]
) -> None:
    hooked = Hooked(face(store))
    lock, helper = make_lock(store=hooked), make_lock()
    lock.acquire()
    helper.extend(5, token=lock.token)  # a keepalive: the item's cas changed under the owner
    lock.release()
    assert [name for name, _ in hooked.calls] == ["add_cas", "delete_cas", "gets", "cas"]
    assert store.get("lock:report") is None


# -- extend ---------------------------------------------------------------------------


def test_extend_adds_to_the_remaining_time(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    holder, other = make_lock(timeout=2), make_lock()
    taken_at = clock()
    holder.acquire()
    clock.advance(1.5)
    holder.extend(3)  # 0.5 left + 3
    clock.now = taken_at + 2 + 3 - 0.001
    assert not other.acquire(blocking=False)
    assert holder.owned()
    clock.advance(3)
    assert other.acquire(blocking=False)


def test_extend_with_replace_ttl_sets_the_remaining_time(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    holder, other = make_lock(timeout=30), make_lock()
    holder.acquire()
    holder.extend(1, replace_ttl=True)
    clock.advance(0.999)
    assert not other.acquire(blocking=False)
    clock.advance(2)  # freed at most ceil(1) + 1 seconds later, not after 30
    assert other.acquire(blocking=False)


def test_extend_then_a_lapsed_release(make_lock: Callable[..., Lock], clock: FakeClock) -> None:
    lock = make_lock(timeout=10)
    lock.acquire()
    clock.advance(8)
    lock.extend(10)  # 2 s left + 10
    clock.advance(11)
    assert lock.owned()
    lock.extend(5, replace_ttl=True)
    clock.advance(7.5)  # past ceil(5) + 1: memcached dropped it
    assert not lock.locked()
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.token is None


def test_extending_a_lapsed_lock_raises(make_lock: Callable[..., Lock], clock: FakeClock) -> None:
    lock = make_lock(timeout=1)
    lock.acquire()
    clock.advance(3)
    with pytest.raises(LockNotOwnedError):
        lock.extend(10)
    assert lock.token is None


def test_extend_needs_a_positive_time(make_lock: Callable[..., Lock]) -> None:
    lock = make_lock()
    lock.acquire()
    with pytest.raises(ConfigurationError):
        lock.extend(0, replace_ttl=True)


# -- blocking: back-off, timeouts, events ------------------------------------------


def test_blocking_acquire_waits_with_backoff_until_the_holder_lapses(
    make_lock: Callable[..., Lock], clock: FakeClock, events: list[object]
) -> None:
    holder = make_lock(timeout=1)
    holder.acquire()
    waiter = make_lock(backoff=Backoff(initial=0.01, maximum=0.2), rng=lambda: 1.0)
    start = clock()
    assert waiter.acquire() is True
    # Sleeps double up to the cap, and the lock is taken once memcached drops it.
    assert clock.sleeps[:6] == near([0.01, 0.02, 0.04, 0.08, 0.16, 0.2])
    assert max(clock.sleeps) <= 0.2
    assert 1 <= clock() - start <= 2 + 0.2
    assert events == [LockWaited("lock:report", near(clock() - start))]


def test_blocking_timeout_bounds_the_wait_exactly(
    make_lock: Callable[..., Lock], clock: FakeClock, events: list[object]
) -> None:
    make_lock(timeout=60).acquire()
    waiter = make_lock(blocking_timeout=0.5)
    start = clock()
    assert waiter.acquire() is False
    assert sum(clock.sleeps) == near(0.5)  # the last sleep is cut to the deadline
    assert events == [LockTimedOut("lock:report", near(0.5))]
    assert clock() - start == near(0.5)


def test_non_blocking_acquire_tries_once(
    make_lock: Callable[..., Lock], clock: FakeClock, store: MemoryStore
) -> None:
    make_lock().acquire()
    hooked = Hooked(face(store))
    assert make_lock(store=hooked, blocking=False).acquire() is False
    assert hooked.calls == [("add_cas", "lock:report")]
    assert clock.sleeps == []


def test_acquire_arguments_override_the_defaults(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    make_lock(timeout=60).acquire()
    waiter = make_lock(blocking=False)
    assert waiter.acquire(blocking=True, blocking_timeout=0.25) is False
    assert sum(clock.sleeps) == near(0.25)


def test_an_event_hook_that_raises_does_not_break_the_lock(
    make_lock: Callable[..., Lock], caplog: pytest.LogCaptureFixture
) -> None:
    make_lock(timeout=60).acquire()

    def broken(event: object) -> None:
        raise RuntimeError("receiver bug")

    assert make_lock(blocking_timeout=0.1, on_event=broken).acquire() is False
    assert "event hook failed" in caplog.text


# -- context manager and decorator ----------------------------------------------------


def test_context_manager_holds_the_lock_for_the_block(
    make_lock: Callable[..., Lock],
) -> None:
    lock = make_lock()
    with lock as held:
        assert held is lock
        assert lock.owned()
    assert not lock.locked()


def test_context_manager_releases_when_the_block_raises(
    make_lock: Callable[..., Lock],
) -> None:
    lock = make_lock()
    with pytest.raises(ZeroDivisionError):
        with lock:
            1 / 0  # noqa: B018
    assert not lock.locked()


def test_context_manager_raises_when_the_lock_is_not_acquired(
    make_lock: Callable[..., Lock],
) -> None:
    make_lock().acquire()
    with pytest.raises(LockTimeoutError, match=r"within 0.2s"):
        with make_lock(blocking_timeout=0.2):
            pytest.fail("the block must not run")
    with pytest.raises(LockTimeoutError, match="it is held"):
        with make_lock(blocking=False):
            pytest.fail("the block must not run")


def test_context_manager_reports_a_lock_that_lapsed_inside_the_block(
    make_lock: Callable[..., Lock], clock: FakeClock
) -> None:
    with pytest.raises(LockNotOwnedError, match="outlived the lock timeout"):
        with make_lock(timeout=1):
            clock.advance(5)


def test_decorator_takes_a_fresh_owner_per_call(
    make_lock: Callable[..., Lock],
) -> None:
    lock = make_lock(blocking=False)

    @lock
    def critical(depth: int) -> str:
        assert lock.locked()
        assert lock.token is None  # the decorating object itself never owns the lock
        if depth:
            with pytest.raises(LockTimeoutError):
                critical(depth - 1)  # a second owner is refused, not let in
        return "done"

    assert critical(1) == "done"
    assert critical(0) == "done"  # released after every call
    assert critical.__name__ == "critical"
    assert not lock.locked()


def test_with_and_the_decorator_release_on_the_way_out(
    make_lock: Callable[..., Lock],
) -> None:
    lock = make_lock(blocking=False)
    inside: list[bool] = []

    @lock
    def job(n: int) -> int:
        inside.append(lock.copy().acquire(blocking=False))
        return n * 2

    with lock as held:
        assert held is lock
        assert lock.owned()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        with lock:
            raise RuntimeError("the block failed")
    assert not lock.locked()  # released all the same
    assert job(2) == 4
    assert job(3) == 6
    assert not lock.locked()
    assert inside == [False, False]  # held during each call, by a fresh owner


# -- the strict view and real memcached ----------------------------------------------


def test_memory_store_is_its_own_authoritative_view(store: MemoryStore) -> None:
    backend = face(store)
    assert authoritative(backend) is backend


@pytest.fixture(params=["meta", "text"])
def cluster(
    memcached_1: list[MemcachedServer], request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    flush(memcached_1)
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(protocol=request.param))
    yield cluster
    cluster.close()


def test_cluster_locks_use_a_strict_view_sharing_health(cluster: Cluster) -> None:
    backend = face(cluster)
    strict = authoritative(backend)
    assert strict is not backend
    assert strict.options.raise_errors
    assert not backend.options.raise_errors  # ordinary traffic still degrades
    assert strict.health() == backend.health()
    assert authoritative(strict) is strict


def test_real_memcached_release_deletes_with_cas_and_negative_exptime(
    cluster: Cluster,
) -> None:
    backend = face(cluster)
    lock = Lock(backend, "lock:real", 10)
    assert lock.acquire(blocking=False)
    assert Lock(backend, "lock:real", 10).acquire(blocking=False) is False  # NOT_STORED
    lock.release()
    assert backend.get("lock:real") is None


def test_real_memcached_never_deletes_a_lapsed_lock_another_owner_took(
    cluster: Cluster,
) -> None:
    backend = face(cluster)
    late, new = Lock(backend, "lock:lapsed", 1), Lock(backend, "lock:lapsed", 10)
    assert late.acquire(blocking=False)
    late.extend(1, replace_ttl=True)  # the fast path's new cas, then a lapse
    # exptime ceil(1) + 1: gone within about 2 s on memcached's whole-second clock, whose
    # tick a busy machine delays: wait for the lapse itself (a hang guard of 10 s).
    for _ in range(200):
        if backend.get("lock:lapsed") is None:
            break
        sleep(0.05)
    assert new.acquire(blocking=False)
    with pytest.raises(LockNotOwnedError, match="another owner may hold it"):
        late.release()
    assert new.owned()
    new.release()
    assert backend.get("lock:lapsed") is None


def test_the_protocol_on_memcached(cluster: Cluster) -> None:
    backend = face(cluster)
    lock, other = Lock(backend, "job", timeout=5), Lock(backend, "job", timeout=5)
    assert lock.acquire()
    assert other.acquire(blocking=False) is False
    lock.extend(5)
    assert lock.owned()
    lock.release()
    assert not lock.locked()
    with other:
        assert other.owned()
    assert not other.locked()


def test_a_token_handed_over_extends_and_releases(cluster: Cluster) -> None:
    backend = face(cluster)
    lock = Lock(backend, "lock:handed-over", 10)
    assert lock.acquire()
    token = lock.token
    assert token is not None
    Lock(backend, "lock:handed-over", 10).extend(20, replace_ttl=True, token=token)
    assert 18 <= (ttl_over_meta(cluster, "lock:handed-over") or 0) <= 22
    Lock(backend, "lock:handed-over", 10).release(token=token)
    assert backend.get("lock:handed-over") is None
    with pytest.raises(LockNotOwnedError):
        lock.release()  # the owner learns it is gone


def test_unreachable_server_raises_instead_of_looking_held() -> None:
    cluster = Cluster([f"127.0.0.1:{free_port()}"])  # nobody listens: refused at once
    backend = face(cluster)
    lock = Lock(backend, "lock:down", 10, blocking_timeout=5)
    with pytest.raises(NodeUnavailableError, match="cannot acquire lock 'lock:down'") as caught:
        lock.acquire()
    assert caught.value.node == cluster.servers[0].node
    with pytest.raises(NodeUnavailableError, match="cannot inspect lock"):
        lock.locked()
    assert backend.get("lock:down") is None  # ordinary reads still degrade to a miss
