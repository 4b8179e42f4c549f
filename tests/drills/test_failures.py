"""Failure drills with real processes: killed, restarted, hung servers and cut connections.

Each drill runs a mixed load (sets, locks, namespaces, ``get_or_compute``, plain
values) from several threads through the Django cluster backend, breaks one
server in the middle, heals it, and records what callers saw: calls, the
exceptions raised into them, the slowest call, acknowledged set members and
keys lost, and the time until the broken server serves again.  Run with ``-s``
for the table.

What every drill asserts: no acknowledged set member, and no acknowledged
value, that its server still holds is lost; nothing partial or garbled is ever
returned; a set that lost writes in the outage says so (IncompleteSetError)
rather than answering short; the broken server serves again.  Latencies and recovery times are
printed, not asserted (a busy machine stretches them; the timing rules are
tested on fake clocks in tests/core/test_failover.py and tests/drills/test_health_recovery.py).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from django_mcpatterns.backend import KetamaMemcacheCache
from django_mcpatterns.core.cluster import Cluster, reset_shared_clusters
from django_mcpatterns.core.exceptions import IncompleteSetError
from django_mcpatterns.core.keys import key_bytes
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer, memcached_cluster

pytestmark = pytest.mark.slow

THREADS = 4
SETS = 12
TIMEOUT = 0.25  # socket timeout of the drills' clusters (connect and I/O)


# -- recording -------------------------------------------------------------------------


@dataclass
class Ack:
    """A set member whose ``sadd`` returned: started and finished at these times."""

    key: str
    member: str
    started: float
    finished: float


@dataclass
class DrillLog:
    """What the callers of one drill saw (thread-safe)."""

    name: str
    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    values: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (value, started)
    lost_with_server: int = 0
    lost: int = 0
    incomplete: int = 0  # acknowledged members of sets that read as IncompleteSetError
    recovery: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, op: str, fn: Callable[[], Any]) -> Any:
        started = time.monotonic()
        try:
            return fn()
        except Exception as exc:
            with self._lock:
                self.errors[f"{op}: {type(exc).__name__}"] += 1
            return _FAILED
        finally:
            with self._lock:
                self.calls += 1
                self.latencies.append(time.monotonic() - started)

    @property
    def slowest(self) -> float:
        return max(self.latencies, default=0.0)

    def row(self) -> str:
        errors = ", ".join(f"{name} x{count}" for name, count in self.errors.most_common()) or "-"
        recovery = f"{self.recovery:.2f}s" if self.recovery is not None else "-"
        return (
            f"{self.name:<22} {self.calls:>6} {len(self.acks):>6} {self.lost:>5} "
            f"{self.lost_with_server:>6} {self.incomplete:>6} {recovery:>9} "
            f"{self.slowest:>8.3f}s  {errors}"
        )


_FAILED = object()
HEADER = (
    f"{'drill':<22} {'calls':>6} {'acked':>6} {'lost':>5} {'w/srv':>6} {'incmpl':>6} "
    f"{'recovery':>9} "
    f"{'slowest':>9}  exceptions seen by callers"
)


def report(log: DrillLog) -> None:
    print(f"\n{HEADER}\n{log.row()}")


# -- the load --------------------------------------------------------------------------


def drill_cache(specs: list[str], **options: Any) -> KetamaMemcacheCache:
    settings = {
        "timeout": TIMEOUT,
        "connect_timeout": TIMEOUT,
        "retry_attempts": 1,
        "retry_timeout": 0.2,
        "dead_timeout": 0.5,
        **options,
    }
    return KetamaMemcacheCache(specs, {"OPTIONS": settings, "TIMEOUT": 300})


class Load:
    """Threads calling every pattern until stopped; each records into ``log``."""

    def __init__(self, specs: list[str], log: DrillLog, **options: Any) -> None:
        self.specs, self.log, self.options = specs, log, options
        self.stop = threading.Event()
        self.counter = itertools.count()
        self.threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(THREADS)
        ]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "a drill thread hung"

    def _work(self, worker: int) -> None:
        cache = drill_cache(self.specs, **self.options)  # Django: one backend per thread
        while not self.stop.is_set():
            self._round(cache, worker, next(self.counter))

    def _round(self, cache: KetamaMemcacheCache, worker: int, n: int) -> None:
        log = self.log
        set_key, member = f"set:{n % SETS}", f"w{worker}-{n}"
        started = time.monotonic()
        # 1: added (a unique member); a degraded write answers 0 (on_outage="degrade").
        if log.call("sadd", lambda: cache.sadd(set_key, member)) == 1:
            with log._lock:
                log.acks.append(Ack(set_key, member, started, time.monotonic()))
        value_key = f"value:{n}"
        started = time.monotonic()
        if log.call("set", lambda: cache.set(value_key, n)) is True:
            with log._lock:
                log.values[value_key] = (n, started)
        log.call("get_or_compute", lambda: cache.get_or_compute(f"gc:{n % 7}", lambda: n))
        log.call("lock", lambda: _lock_cycle(cache, f"lock:{n % 5}"))
        log.call("namespace", lambda: _namespace_cycle(cache, n))
        log.call("smembers", lambda: cache.smembers(set_key))


def _lock_cycle(cache: KetamaMemcacheCache, name: str) -> None:
    lock = cache.lock(name, timeout=5, blocking=False)
    if lock.acquire():
        lock.release()


def _namespace_cycle(cache: KetamaMemcacheCache, n: int) -> None:
    ns = cache.namespace("drill", n % 3)
    ns.set("k", n)
    got = ns.get("k")
    assert got is None or isinstance(got, int), f"namespace read {got!r}"
    if n % 10 == 0:
        ns.invalidate()


# -- checks ----------------------------------------------------------------------------


def server_of(cache: KetamaMemcacheCache, key: str) -> str:
    cluster: Cluster = cache._cache
    return cluster.ring.get_node(key_bytes(cache.make_and_validate_key(key)))


def wait_until_serving(cache: KetamaMemcacheCache, node: str, since: float) -> float:
    """Seconds from ``since`` until a key of ``node`` is written and read back."""
    probe = next(f"probe:{i}" for i in itertools.count() if server_of(cache, f"probe:{i}") == node)
    deadline = since + 10
    while time.monotonic() < deadline:
        if cache.set(probe, "back") and cache.get(probe) == "back":
            return time.monotonic() - since
        time.sleep(0.01)
    pytest.fail(f"{node} did not serve again within 10s")


def check_acknowledged(
    log: DrillLog,
    cache: KetamaMemcacheCache,
    lost_window: tuple[float, float] | None = None,
    victim: str | None = None,
) -> None:
    """Count acknowledged members and values missing now.

    Those of ``victim`` acknowledged before ``lost_window[1]`` (the restart)
    were held by a server that died: counted as lost with their server.  A set
    that lost writes in the outage reads as IncompleteSetError (it says so
    rather than answering short): counted as incomplete.  Every other
    acknowledged one must be there (``log.lost`` stays 0).
    """
    members: dict[str, set[Any] | None] = {}
    for ack in log.acks:
        if ack.key not in members:
            try:
                members[ack.key] = cache.smembers(ack.key)
            except IncompleteSetError:
                members[ack.key] = None
        held = members[ack.key]
        if held is None:
            log.incomplete += 1
            continue
        if ack.member in held:
            continue
        died = (
            lost_window is not None
            and server_of(cache, ack.key) == victim
            and ack.started < lost_window[1]
        )
        if died:
            log.lost_with_server += 1
        else:
            log.lost += 1
    found = cache.get_many(list(log.values))
    for key, (value, started) in log.values.items():
        if found.get(key) == value:
            continue
        died = (
            lost_window is not None and server_of(cache, key) == victim and started < lost_window[1]
        )
        if died:
            log.lost_with_server += 1
        else:
            log.lost += 1


@pytest.fixture
def servers() -> Iterator[list[MemcachedServer]]:
    with memcached_cluster(3) as started:
        yield started
    reset_shared_clusters()  # the drills' clusters point at servers that are gone


# -- the drills ------------------------------------------------------------------------


def test_sigkill_and_restart_during_mixed_load(servers: list[MemcachedServer]) -> None:
    specs = [s.spec for s in servers]
    log = DrillLog("SIGKILL + restart")
    victim = servers[0]
    cache = drill_cache(specs)
    with Load(specs, log):
        time.sleep(0.8)
        killed_at = time.monotonic()
        victim.kill()
        time.sleep(0.6)
        victim.start()  # same port, empty
        restarted_at = time.monotonic()
        log.recovery = wait_until_serving(cache, victim.spec, restarted_at)
        time.sleep(0.6)
    check_acknowledged(log, cache, (killed_at, restarted_at), victim.spec)
    report(log)
    assert log.calls > 100
    assert log.lost == 0, "an acknowledged member or value its server still holds was lost"


def test_sigstop_hung_server_latency_is_bounded_by_the_timeouts(
    servers: list[MemcachedServer],
) -> None:
    specs = [s.spec for s in servers]
    log = DrillLog("SIGSTOP (hung server)")
    victim = servers[1]
    cache = drill_cache(specs)
    with Load(specs, log):
        time.sleep(0.5)
        victim.pause()
        try:
            time.sleep(1.2)
        finally:
            victim.resume()
        resumed_at = time.monotonic()
        log.recovery = wait_until_serving(cache, victim.spec, resumed_at)
        time.sleep(0.4)
    check_acknowledged(log, cache)  # a hung server loses nothing
    report(log)
    assert log.errors, "the hung server went unnoticed"
    assert log.lost == 0


def test_connections_cut_mid_response_never_return_partial_data(
    servers: list[MemcachedServer],
) -> None:
    log = DrillLog("cut mid-response")
    with Proxy(servers[2].port) as proxy:
        specs = [proxy.spec]
        # Never dead, retried after 50 ms: every call below reaches the proxy and is cut.
        cache = drill_cache(specs, retry_attempts=100, retry_timeout=0.05)
        big = bytes(range(256)) * 800  # 200 KB: its reply is cut
        members = {f"member-{i:05d}-" + "x" * 40 for i in range(3000)}  # about 170 KB
        assert cache.set("big", big)
        cache.sadd("many", *members)
        assert cache.set("small", "s")
        for i in range(20):
            log.acks.append(Ack("acked", f"m{i}", 0, 0))
            cache.sadd("acked", f"m{i}")
        cache.store.close()  # new connections: each counts its reply bytes from zero
        proxy.cut_after = 64 * 1024
        reads: list[tuple[str, Callable[[], Any], tuple[Any, ...]]] = [
            ("get", lambda: cache.get("big"), (None, big)),
            (
                "get_many",
                lambda: cache.get_many(["big", "small"]),
                ({}, {"big": big, "small": "s"}),
            ),
            ("smembers", lambda: cache.smembers("many"), (set(), members)),
        ]
        for _ in range(4):
            for op, read, allowed in reads:
                got = log.call(op, read)
                # A miss (the degraded answer) or an error, never part of the reply.
                assert got is _FAILED or any(got == ok for ok in allowed), f"{op}: partial"
                time.sleep(0.06)  # past retry_timeout: the next call tries the server again
        strict = drill_cache(specs, retry_attempts=100, retry_timeout=0.05, raise_errors=True)
        for _ in range(2):
            # With raise_errors the cut is an error in the caller, never data.
            assert log.call("get (raise_errors)", lambda: strict.get("big")) is _FAILED
            time.sleep(0.06)
        cuts = proxy.cuts
        proxy.cut_after = None
        healed_at = time.monotonic()
        log.recovery = wait_until_serving(cache, proxy.spec, healed_at)
        assert cache.get("big") == big
        assert cache.smembers("many") == members
        check_acknowledged(log, cache)
    log.name = f"cut mid-response ({cuts} cuts)"
    report(log)
    assert cuts >= 14  # every read above was cut
    # The get was sent: its outcome is unknown (OutcomeUnknownError, a NodeUnavailableError).
    assert log.errors == Counter({"get (raise_errors): OutcomeUnknownError": 2})
    assert log.lost == 0
