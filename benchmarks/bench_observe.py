"""What instrumentation costs: an instrumented get vs an uninstrumented one, side by side.

Starts one memcached on loopback and runs ``Cluster.get`` (a hit) and
``Cluster.set`` through clusters that differ only in ``OPTIONS["instrumentation"]``,
in both protocols, interleaved round by round so drift hits all alike.  Prints the
median time per operation and the ratio to the uninstrumented cluster.

Configurations:
  off                 instrumentation off (the default)
  prometheus          prometheus_client counters and histogram
  otel (API only)     opentelemetry-api with no SDK configured: spans are no-ops
  otel (SDK)          the SDK records every span (a processor that drops them:
                      the cost of making spans, without an exporter's)
  prometheus+otel     both, with the SDK recording

Target: an instrumented get <= 1.15x an uninstrumented one (prometheus, and
opentelemetry without a recording SDK).

    python benchmarks/bench_observe.py [--rounds 9] [--ops 4000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from prometheus_client import CollectorRegistry

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import memcached_cluster

TARGET = 1.15
TARGETED = ("prometheus", "otel (API only)")


class _Drop(SpanProcessor):
    """Receives every finished span and keeps none."""

    def on_end(self, span: ReadableSpan) -> None:
        pass


def per_op(fn: Callable[[], object], ops: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process's) per call of ``fn``."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(ops):
        fn()
    return (time.perf_counter() - wall) / ops, (time.process_time() - cpu) / ops


def clusters(spec: str, protocol: str) -> dict[str, Cluster]:
    def cluster(*names: str) -> Cluster:
        options = ClusterOptions(
            protocol=protocol,  # type: ignore[arg-type]
            instrumentation=names,
            prometheus_registry=CollectorRegistry(),
        )
        return Cluster([spec], options)

    return {
        "off": cluster(),
        "prometheus": cluster("prometheus"),
        "otel (API only)": cluster("opentelemetry"),
    }


Timing = tuple[float, float]  # median wall-clock and CPU seconds per op


def measure(ops: dict[str, Callable[[], object]], n: int, rounds: int) -> dict[str, Timing]:
    walls: dict[str, list[float]] = {name: [] for name in ops}
    cpus: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            wall, cpu = per_op(op, n)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=4000)
    args = parser.parse_args()
    failures = 0
    print(
        f"{'protocol':<8} {'op':<4} {'configuration':<17} {'wall':>8} {'ratio':>6} "
        f"{'CPU':>8} {'+CPU':>7} {'bound':>6}  target"
    )
    with memcached_cluster(1) as servers:
        spec = servers[0].spec
        for protocol in ("meta", "text"):
            # The API-only clusters are measured before the SDK is installed: once a
            # provider is set, every opentelemetry cluster records.
            plain = clusters(spec, protocol)
            results: dict[str, dict[str, Timing]] = {}
            for operation in ("get", "set"):
                results[operation] = measure(
                    {name: _op(c, operation) for name, c in plain.items()}, args.ops, args.rounds
                )
            if not isinstance(trace.get_tracer_provider(), TracerProvider):
                provider = TracerProvider()
                provider.add_span_processor(_Drop())
                trace.set_tracer_provider(provider)
            recording = {
                "off": Cluster([spec], ClusterOptions(protocol=protocol)),  # type: ignore[arg-type]
                "otel (SDK)": Cluster(
                    [spec],
                    ClusterOptions(protocol=protocol, instrumentation=("opentelemetry",)),  # type: ignore[arg-type]
                ),
                "prometheus+otel": Cluster(
                    [spec],
                    ClusterOptions(
                        protocol=protocol,  # type: ignore[arg-type]
                        instrumentation=("prometheus", "opentelemetry"),
                        prometheus_registry=CollectorRegistry(),
                    ),
                ),
            }
            for operation in ("get", "set"):
                again = measure(
                    {name: _op(c, operation) for name, c in recording.items()},
                    args.ops,
                    args.rounds,
                )
                base_wall, base_cpu = again.pop("off")
                first_wall, first_cpu = results[operation]["off"]
                for name, (wall, cpu) in again.items():
                    # Scaled to the first run's baseline: each group has its own "off".
                    results[operation][name] = (
                        wall / base_wall * first_wall,
                        cpu - base_cpu + first_cpu,
                    )
            for operation, found in results.items():
                base_wall, base_cpu = found["off"]
                for name, (wall, cpu) in found.items():
                    # The instrumentation is CPU work in this process; the round trip is a
                    # wait.  "bound": the wall ratio if every added CPU microsecond were
                    # added to the wall-clock time (robust where the wall ratio is noise).
                    added = cpu - base_cpu
                    bound = (base_wall + max(added, 0.0)) / base_wall
                    verdict = ""
                    if operation == "get" and name in TARGETED:
                        ok = bound <= TARGET
                        failures += not ok
                        verdict = f"<= {TARGET:.2f} {'ok' if ok else 'MISSED'}"
                    print(
                        f"{protocol:<8} {operation:<4} {name:<17} {wall * 1e6:>6.1f}us "
                        f"{wall / base_wall:>6.2f} {cpu * 1e6:>6.1f}us {added * 1e6:>+6.1f} "
                        f"{bound:>6.2f}  {verdict}"
                    )
            for cluster in (*plain.values(), *recording.values()):
                cluster.close()
    sys.exit(1 if failures else 0)


def _op(cluster: Cluster, operation: str) -> Callable[[], Any]:
    value = "v" * 100
    cluster.set("bench:observe", value)
    if operation == "get":
        return lambda: cluster.get("bench:observe")
    return lambda: cluster.set("bench:observe", value)


if __name__ == "__main__":
    main()
