"""Namespaced reads vs plain reads, and what each operation costs on the wire.

Starts its own 3 memcached servers on loopback and runs, interleaved round by
round, plain and namespaced operations through the core ``Cluster`` and through
Django's cache API (``KetamaMemcacheCache``).  For each operation it prints the
median time per call, the median ratio to the plain ``get`` of the same layer
(paired round by round, so a busy machine's load hits both alike), the
requests the client sent (a counting socket module, pymemcache's
``socket_module``) and the keys and servers memcached counted (``stats``:
``cmd_get``, ``cmd_set``, ``incr_hits``).

Targets: a namespaced get <= 1.2x a plain get; 1 request per namespaced get;
1 request per invalidation.

    python benchmarks/bench_namespaces.py [--rounds 101] [--ops 200]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import django
from django.conf import settings

settings.configure(USE_TZ=True)
django.setup()

from pymemcache.client.base import Client  # noqa: E402

from django_mcpatterns.backend import KetamaMemcacheCache  # noqa: E402
from django_mcpatterns.core.cluster import Cluster  # noqa: E402
from django_mcpatterns.core.namespaces import Namespaces  # noqa: E402
from django_mcpatterns.core.options import ClusterOptions  # noqa: E402
from tests.harness import LOOPBACK, MemcachedServer, memcached_cluster  # noqa: E402

RATIO_TARGET = 1.2
COUNTERS = ("cmd_get", "cmd_set", "incr_hits", "incr_misses", "delete_hits", "cas_hits")
VALUE = {"name": "ann", "bio": "x" * 80}
# The same data under a plain key, as a project without namespaces would name it.
PLAIN = "user:42:profile"


class CountingSockets:
    """A ``socket`` module stand-in that counts ``sendall`` calls: one per request."""

    def __init__(self) -> None:
        self.sends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)

    def socket(self, *args: Any) -> Any:
        counter = self

        class Counted(socket.socket):
            def sendall(self, data: Any, *flags: Any) -> None:
                counter.sends += 1
                super().sendall(data, *flags)

        return Counted(*args)


def per_op(fn: Callable[[], object], ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        fn()
    return (time.perf_counter() - start) / ops


def measure(
    cases: dict[str, Callable[[], object]], ops: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Per case: median seconds per call, and the median of its per-round ratio to the first.

    Rounds are short and the cases run one after another within each, so the
    load of a busy machine hits them alike; the ratio is paired round by round.
    """
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(per_op(fn, ops))
    base = next(iter(samples.values()))
    return {
        name: (
            statistics.median(values),
            statistics.median(v / b for v, b in zip(values, base, strict=True)),
        )
        for name, values in samples.items()
    }


def server_stats(servers: list[MemcachedServer]) -> list[Counter[str]]:
    found = []
    for server in servers:
        client = Client((LOOPBACK, server.port), default_noreply=False)
        try:
            stats = client.stats()
        finally:
            client.close()
        found.append(Counter({name: int(stats[name.encode()]) for name in COUNTERS}))
    return found


def wire_cost(
    fn: Callable[[], object], sockets: CountingSockets, servers: list[MemcachedServer]
) -> tuple[int, str]:
    """(requests sent, what memcached counted) for one call of ``fn``."""
    before, sends = server_stats(servers), sockets.sends
    fn()
    after = server_stats(servers)
    moved = [a - b for a, b in zip(after, before, strict=True)]
    touched = sum(1 for m in moved if m)
    total: Counter[str] = Counter()
    for m in moved:
        total.update(m)
    counted = ", ".join(f"{name} {n}" for name, n in sorted(total.items()) if n)
    return sockets.sends - sends, f"{counted} on {touched} server{'s' * (touched != 1)}"


def core_cases(cluster: Cluster) -> dict[str, Callable[[], object]]:
    spaces = Namespaces(cluster)
    user = spaces.namespace("user", 42)
    inner = spaces.namespace("org", 1).namespace("user", 42)
    keys = [f"k{i}" for i in range(10)]
    plain_keys = [f"user:42:{key}" for key in keys]
    cluster.set(PLAIN, VALUE)
    cluster.set_many(dict.fromkeys(plain_keys, VALUE))
    for ns in (user, inner):
        ns.set("profile", VALUE)
        ns.set_many(dict.fromkeys(keys, VALUE))
    return {
        "get (plain)": lambda: cluster.get(PLAIN),
        "ns.get": lambda: user.get("profile"),
        "ns.get, nested 2 deep": lambda: inner.get("profile"),
        "namespace(...).get": lambda: spaces.namespace("user", 42).get("profile"),
        "get_many(10) (plain)": lambda: cluster.get_many(plain_keys),
        "ns.get_many(10)": lambda: user.get_many(keys),
        "set (plain)": lambda: cluster.set(PLAIN, VALUE),
        "ns.set": lambda: user.set("profile", VALUE),
        "ns.invalidate": user.invalidate,
    }


def django_cases(cache: KetamaMemcacheCache) -> dict[str, Callable[[], object]]:
    user = cache.namespace("user", 42)
    cache.set(PLAIN, VALUE)
    user.set("profile", VALUE)
    user.get_or_compute("report", lambda: VALUE, 3600)
    return {
        "get (plain)": lambda: cache.get(PLAIN),
        "ns.get": lambda: user.get("profile"),
        "namespace(...).get": lambda: cache.namespace("user", 42).get("profile"),
        "ns.get_or_compute (fresh)": lambda: user.get_or_compute("report", dict, 3600),
        "ns.invalidate": user.invalidate,
    }


def report(
    layer: str,
    timed: dict[str, Callable[[], object]],
    counted: dict[str, Callable[[], object]],
    sockets: CountingSockets,
    servers: list[MemcachedServer],
    args: argparse.Namespace,
) -> list[str]:
    """Print one layer's rows; return the targets it missed."""
    # Invalidation changes what the reads see: time it on its own, after the reads.
    plain = timed["get (plain)"]
    reads = {name: fn for name, fn in timed.items() if name != "ns.invalidate"}
    times = measure(reads, args.ops, args.rounds)
    times["ns.invalidate"] = measure(
        {"get (plain)": plain, "ns.invalidate": timed["ns.invalidate"]}, args.ops, args.rounds
    )["ns.invalidate"]
    for name, fn in counted.items():
        if name != "ns.invalidate":
            fn()  # warm: connections open, versions exist
    missed = []
    for name in timed:
        requests, on_wire = wire_cost(counted[name], sockets, servers)
        seconds, ratio = times[name]
        verdict = ""
        if name == "ns.get":
            ok = ratio <= RATIO_TARGET and requests == 1
            verdict = f"<= {RATIO_TARGET}x, 1 request: {'ok' if ok else 'MISSED'}"
            missed += [] if ok else [f"{layer} ns.get"]
        elif name == "ns.invalidate":
            ok = requests == 1
            verdict = f"1 request: {'ok' if ok else 'MISSED'}"
            missed += [] if ok else [f"{layer} ns.invalidate"]
        print(
            f"{layer:<7} {name:<27} {seconds * 1e6:>8.1f} {ratio:>6.2f} {requests:>8}  "
            f"{on_wire:<40} {verdict}"
        )
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--ops", type=int, default=200, help="calls per case and round")
    args = parser.parse_args()

    print(
        f"{'layer':<7} {'operation':<27} {'µs/op':>8} {'ratio':>6} {'requests':>8}  "
        f"{'memcached counted':<40} target"
    )
    missed: list[str] = []
    with memcached_cluster(3) as servers:
        specs = [s.spec for s in servers]
        sockets = CountingSockets()
        counted_options = ClusterOptions(client_options={"socket_module": sockets})
        missed += report(
            "core",
            core_cases(Cluster(specs)),
            core_cases(Cluster(specs, counted_options)),
            sockets,
            servers,
            args,
        )
        timed_cache = KetamaMemcacheCache(specs, {})
        counted_cache = KetamaMemcacheCache(specs, {"OPTIONS": {"socket_module": sockets}})
        missed += report(
            "django",
            django_cases(timed_cache),
            django_cases(counted_cache),
            sockets,
            servers,
            args,
        )
    if missed:
        print("missed:", ", ".join(missed))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
