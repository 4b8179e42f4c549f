"""What instrumentation costs: an instrumented get vs an uninstrumented one, side by side.

Starts one memcached on loopback and runs ``Cluster.get`` (a hit) and
``Cluster.set`` through clusters that differ only in ``OPTIONS["instrumentation"]``,
in both protocols.  The configurations take turns call by call (each call timed
alone, the order rotated every round), so a busy neighbour slows all of them
alike; the figure per configuration is the median of its calls, which ignores
the calls a neighbour happened to stall.  Prints the median per call and its
ratio to the uninstrumented cluster's.

Configurations:
  off                 instrumentation off (the default)
  prometheus          prometheus_client counters and histogram
  otel (no SDK)       opentelemetry-api with no SDK configured: spans are no-ops
  otel (SDK, 1%)      the SDK with a 1% TraceIdRatioBased sampler (and no parent)
  otel (SDK, all)     the SDK recording every span (a processor that drops them:
                      the cost of making spans, not an exporter's)
  prometheus+otel 1%  both

Then the same inside a request whose trace was sampled out (what 99% of the
requests of a site sampling 1% are): every call runs with that request's span
current, "off" included.

Target: an instrumented get <= 1.15x an uninstrumented one with prometheus and
opentelemetry without an SDK, and with the SDK sampling 1% inside requests (a
root span per get pays the SDK's sampler on every call: reported, not targeted;
so is "otel (SDK, all)", the SDK's own cost of recording a span: see docs).

    python benchmarks/bench_observe.py [--rounds 21] [--ops 1500] [--production]
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

from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import memcached_cluster

TARGET = 1.15
CPU_TARGET = 8e-6  # at most 8 µs of CPU added per instrumented get (issue 23)
PRODUCTION = ("off", "prometheus", "production")  # in the production mix
UNTARGETED = ("otel (SDK, all)", "otel (SDK, 1%)", "prometheus+otel 1%")
IN_REQUEST = ("off", "otel (SDK, 1%)", "prometheus+otel 1%")
SAMPLED_AT = 37  # the sampled-in request's place in a block of 100


class _Drop(SpanProcessor):
    """Receives every finished span and keeps none."""

    def on_end(self, span: ReadableSpan) -> None:
        pass


def _provider(ratio: float, parent_based: bool = False) -> TracerProvider:
    sampler = TraceIdRatioBased(ratio)
    provider = TracerProvider(sampler=ParentBased(sampler) if parent_based else sampler)
    provider.add_span_processor(_Drop())
    return provider


def configurations(site: TracerProvider | None = None) -> dict[str, dict[str, Any]]:
    """The clusters' options; ``site``: the tracer provider of the site's own request spans."""
    sampled, everything = _provider(0.01), _provider(1.0)
    return {
        "off": {},
        "prometheus": {"instrumentation": ("prometheus",)},
        "otel (no SDK)": {"instrumentation": ("opentelemetry",)},
        "otel (SDK, 1%)": {"instrumentation": ("opentelemetry",), "tracer_provider": sampled},
        "otel (SDK, all)": {"instrumentation": ("opentelemetry",), "tracer_provider": everything},
        "prometheus+otel 1%": {
            "instrumentation": ("prometheus", "opentelemetry"),
            "tracer_provider": sampled,
        },
        # What a site configures: both, the SDK's default sampler (a request's
        # decision holds for its spans) sampling 1% of the traces it starts.
        "production": {
            "instrumentation": ("prometheus", "opentelemetry"),
            "tracer_provider": site if site is not None else _provider(0.01, parent_based=True),
        },
    }


def measure(ops: dict[str, Callable[[], object]], n: int, rounds: int) -> dict[str, float]:
    """The median seconds per call of each op; the ops take turns call by call."""
    calls: dict[str, list[int]] = {name: [] for name in ops}
    order = list(ops.items())
    clock = time.perf_counter_ns
    for turn in range(rounds):
        rotated = order[turn % len(order) :] + order[: turn % len(order)]
        for _ in range(n):
            for name, op in rotated:
                start = clock()
                op()
                calls[name].append(clock() - start)
    return {name: statistics.median(times) / 1e9 for name, times in calls.items()}


def operation(cluster: Cluster, name: str) -> Callable[[], Any]:
    value = "v" * 100
    cluster.set("bench:observe", value)
    if name == "get":
        return lambda: cluster.get("bench:observe")
    return lambda: cluster.set("bench:observe", value)


def request_context(sampled: bool) -> context.Context:
    """The context of a request whose trace was sampled in, or out (its span current)."""
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else 0)
    parent = trace.NonRecordingSpan(
        trace.SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=flags)
    )
    return trace.set_span_in_context(parent)


def in_unsampled_request(op: Callable[[], Any]) -> Callable[[], Any]:
    """``op`` with a sampled-out request's span current (as a traced web app runs it)."""
    request = request_context(sampled=False)

    def run() -> Any:
        token = context.attach(request)
        try:
            return op()
        finally:
            context.detach(token)

    return run


def production_mix(
    ops: dict[str, Callable[[], Any]], n: int, rounds: int, site: TracerProvider
) -> dict[str, tuple[float, float]]:
    """Per configuration, the (wall, CPU) seconds of a get in a site's mix of requests.

    Every call runs inside a request, as a traced site runs it: the site's
    tracer (``site``, the SDK with its default sampler, ``ParentBased``) starts
    the request's server span under the caller's propagated trace context and
    makes it current, the view's get runs, the span ends.  One request in a
    hundred comes sampled in (its spans are recorded), the rest sampled out; each
    has its own context and span, made for it.  "off" runs in the same requests:
    the site traces its requests and only the cache's instrumentation differs.
    The configurations take turns in blocks of 100 requests (the sampled one at
    a place of its own, not first), the order rotating.  Wall: each get timed
    alone, the median of the sampled-out gets weighted 99 to 1 with the median
    of the sampled-in ones, so a neighbour's stall counts for none of them.
    CPU: this thread's (``thread_time``: the client's work and its system calls,
    not memcached's) per block, the requests' spans included (alike in every
    configuration), the median block over 100.
    """
    tracer = site.get_tracer("site")
    flags = [
        trace.TraceFlags(trace.TraceFlags.SAMPLED if i == SAMPLED_AT else 0) for i in range(100)
    ]
    walls = {(name, sampled): [] for name in ops for sampled in (False, True)}
    cpus: dict[str, list[int]] = {name: [] for name in ops}
    order = list(ops.items())
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    attach, detach, in_context = context.attach, context.detach, trace.set_span_in_context
    kind = trace.SpanKind.SERVER
    for turn in range(rounds * max(1, n // 100)):
        rotated = order[turn % len(order) :] + order[: turn % len(order)]
        for name, op in rotated:
            sampled_out, sampled_in = walls[(name, False)], walls[(name, True)]
            cpu = cpu_clock()
            for i, trace_flags in enumerate(flags):
                caller = trace.SpanContext(0x1234 + turn, 0x5678 + i, True, trace_flags)
                remote = in_context(trace.NonRecordingSpan(caller))
                span = tracer.start_span("GET /view", context=remote, kind=kind)
                token = attach(in_context(span, remote))
                start = clock()
                op()
                (sampled_in if i == SAMPLED_AT else sampled_out).append(clock() - start)
                detach(token)
                span.end()
            cpus[name].append(cpu_clock() - cpu)

    def wall(name: str) -> float:
        out, sampled = walls[(name, False)], walls[(name, True)]
        return (0.99 * statistics.median(out) + 0.01 * statistics.median(sampled)) / 1e9

    return {name: (wall(name), statistics.median(cpus[name]) / 100 / 1e9) for name in ops}


def report_production(protocol: str, found: dict[str, tuple[float, float]]) -> int:
    """Print the production mix's figures; return how many targets were missed."""
    missed = 0
    base_wall, base_cpu = found["off"]
    for name, (wall, cpu) in found.items():
        ratio, added = wall / base_wall, cpu - base_cpu
        verdict = ""
        if name != "off":
            ok = ratio <= TARGET and added <= CPU_TARGET
            missed += not ok
            verdict = (
                f"<= {TARGET:.2f} and +{CPU_TARGET * 1e6:.0f}us CPU {'ok' if ok else 'MISSED'}"
            )
        extra = (wall - base_wall) * 1e6
        print(
            f"{protocol:<8} get  {name:<19} {wall * 1e6:>7.1f}us {extra:>+6.1f}us {ratio:>6.2f}"
            f"  cpu {cpu * 1e6:>6.1f}us {added * 1e6:>+5.1f}us  {verdict}"
        )
    return missed


def report(protocol: str, op: str, found: dict[str, float], targeted: bool) -> int:
    """Print one operation's figures; return how many targets were missed."""
    missed = 0
    base = found["off"]
    for name, seconds in found.items():
        ratio = seconds / base
        verdict = ""
        if targeted and op == "get" and name != "off":
            ok = ratio <= TARGET
            missed += not ok
            verdict = f"<= {TARGET:.2f} {'ok' if ok else 'MISSED'}"
        print(
            f"{protocol:<8} {op:<4} {name:<19} {seconds * 1e6:>7.1f}us "
            f"{(seconds - base) * 1e6:>+6.1f}us {ratio:>6.2f}  {verdict}"
        )
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ops", type=int, default=500, help="calls of each per round")
    parser.add_argument(
        "--production", action="store_true", help="only the production mix (the issue's target)"
    )
    args = parser.parse_args()
    failures = 0
    print(
        f"{'protocol':<8} {'op':<4} {'configuration':<19} {'per call':>9} {'added':>7} "
        f"{'ratio':>6}  target"
    )
    site = _provider(0.01, parent_based=True)  # the site's: its request spans and the cache's
    with memcached_cluster(1) as servers:
        spec = servers[0].spec
        for protocol in ("meta", "text"):
            clusters = {
                name: Cluster(
                    [spec],
                    ClusterOptions(
                        protocol=protocol,  # type: ignore[arg-type]
                        prometheus_registry=CollectorRegistry(),
                        **options,
                    ),
                )
                for name, options in configurations(site).items()
            }
            gets = {name: operation(clusters[name], "get") for name in PRODUCTION}
            print(f"{protocol:<8} get  in production (inside requests, 1% sampled):")
            failures += report_production(
                protocol, production_mix(gets, args.ops, args.rounds, site)
            )
            for op in () if args.production else ("get", "set"):
                ops = {
                    name: operation(c, op) for name, c in clusters.items() if name != "production"
                }
                found = measure(ops, args.ops, args.rounds)
                plain = {name: t for name, t in found.items() if name not in UNTARGETED}
                failures += report(protocol, op, plain, targeted=True)
                report(
                    protocol,
                    op,
                    {"off": found["off"]}
                    | {name: t for name, t in found.items() if name in UNTARGETED},
                    targeted=False,
                )
                in_request = {name: in_unsampled_request(ops[name]) for name in IN_REQUEST}
                found = measure(in_request, args.ops, args.rounds)
                print(f"{'':<8} {'':<4} in an unsampled request:")
                failures += report(protocol, op, found, targeted=True)
            for cluster in clusters.values():
                cluster.close()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
