"""Instructions an instrumented get adds, under callgrind: bench_observe.py's mix, load-proof.

Counts the user-space instructions (callgrind's ``Ir``) of a get (a hit, one
loopback memcached) in the production mix of ``bench_observe.py``: every get
inside a request, one get per request, one request in a hundred sampled in.
Each case is a block of such requests (each request's context attached, its
get, detached), less a block that only attaches and detaches, divided by the
gets.  Cases differ only in ``OPTIONS["instrumentation"]``:

  off                 no instrumentation
  prometheus          prometheus_client metrics
  otel 1%             the OpenTelemetry SDK, ParentBased(1%) (a site's default sampler)
  production          both (what bench_observe.py targets)
  production, 0%      both, no request sampled in (the 99%: what a sampled-out get costs)
  production, 1 request  both, every get in one sampled-out request (the verdict kept)

Each instrumented case is printed with what it adds to "off", in both protocols.
The inner process is this script under ``valgrind --tool=callgrind
--instr-atstart=no`` (as ``callgrind_ops.py``, whose stub it builds): two runs
agree within a few hundred instructions.

    python benchmarks/callgrind_observe.py [--requests 500] [--json out.json]
        [--compare before.json] [--keep DIR]

Needs valgrind and gcc (``apt-get install valgrind gcc``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.callgrind_ops import require_tools, run_under_callgrind  # noqa: E402

CASES = ("off", "prometheus", "otel 1%", "production", "production, 0%", "production, 1 request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="gets counted per case")
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument("--compare", type=Path, help="a JSON from --json to print beside")
    parser.add_argument("--keep", type=Path, help="keep callgrind's dumps in this directory")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(json.loads(args.inner))
        return
    require_tools()

    from benchmarks.callgrind_ops import build_stub
    from tests.harness import memcached_cluster

    with tempfile.TemporaryDirectory() as tmp, memcached_cluster(1) as servers:
        plan = {
            "stub": str(build_stub(Path(tmp))),
            "server": servers[0].spec,
            "requests": max(100, args.requests // 100 * 100),
        }
        counts = under_callgrind(plan, Path(tmp))
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for dump in Path(tmp).glob("callgrind.out*"):
                shutil.copy(dump, args.keep)
    if args.json:
        args.json.write_text(json.dumps(counts, indent=1))
    before = json.loads(args.compare.read_text()) if args.compare else {}
    print("Instructions per get in the production mix (callgrind Ir, client process)")
    print(
        f"{'protocol':<8} {'case':<22} {'per get':>9} {'added':>8}"
        + (f" {'before':>9} {'added':>8}" if before else "")
    )
    for protocol in ("meta", "text"):
        base = counts[f"{protocol}:off"]
        for case in CASES:
            now = counts[f"{protocol}:{case}"]
            line = f"{protocol:<8} {case:<22} {now:>9,.0f} {now - base:>+8,.0f}"
            if f"{protocol}:{case}" in before:
                then = before[f"{protocol}:{case}"]
                line += f" {then:>9,.0f} {then - before[f'{protocol}:off']:>+8,.0f}"
            print(line)


def under_callgrind(plan: dict[str, Any], tmp: Path) -> dict[str, float]:
    totals, _ = run_under_callgrind(__file__, plan, tmp)
    n = plan["requests"]
    found = {}
    for label in {label.split("|")[0] for label in totals}:
        protocol, index = label.split(":")
        found[f"{protocol}:{CASES[int(index)]}"] = (
            totals[f"{label}|ops"] - totals[f"{label}|idle"]
        ) / n
    return found


# -- the inner process, under callgrind ------------------------------------------------


def inner(plan: dict[str, Any]) -> None:
    from opentelemetry import context
    from prometheus_client import CollectorRegistry

    from benchmarks.bench_observe import _provider, request_context
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.options import ClusterOptions

    lib = ctypes.CDLL(plan["stub"])
    lib.bench_dump.argtypes = [ctypes.c_char_p]
    both = ("prometheus", "opentelemetry")
    options: dict[str, dict[str, Any]] = {
        "off": {},
        "prometheus": {"instrumentation": ("prometheus",)},
        "otel 1%": {
            "instrumentation": ("opentelemetry",),
            "tracer_provider": _provider(0.01, parent_based=True),
        },
        "production": {
            "instrumentation": both,
            "tracer_provider": _provider(0.01, parent_based=True),
        },
        "production, 0%": {
            "instrumentation": both,
            "tracer_provider": _provider(0.01, parent_based=True),
        },
        "production, 1 request": {
            "instrumentation": both,
            "tracer_provider": _provider(0.01, parent_based=True),
        },
    }
    sampled = [request_context(sampled=i == 0) for i in range(100)]
    unsampled = [request_context(sampled=False) for _ in range(100)]
    one = [request_context(sampled=False)] * 100
    n = plan["requests"]
    blocks: dict[str, tuple[Callable[[], Any], list[Any]]] = {}
    for protocol in ("meta", "text"):
        for case in CASES:
            cluster = Cluster(
                [plan["server"]],
                ClusterOptions(
                    protocol=protocol,  # type: ignore[arg-type]
                    prometheus_registry=CollectorRegistry(),
                    **options[case],
                ),
            )
            cluster.set("bench:observe", b"v" * 100)
            get = (lambda c: lambda: c.get("bench:observe"))(cluster)
            contexts = {"production, 0%": unsampled, "production, 1 request": one}.get(
                case, sampled
            )
            blocks[f"{protocol}:{CASES.index(case)}"] = (get, contexts)

    def run(get: Callable[[], Any], contexts: list[Any]) -> None:
        attach, detach = context.attach, context.detach
        for _ in range(n // 100):
            for request in contexts:
                token = attach(request)
                get()
                detach(token)

    def nothing() -> None:
        pass

    for get, contexts in blocks.values():  # warm: connections, caches, the adaptive interpreter
        run(get, contexts)
        run(nothing, contexts)
    lib.bench_start()
    for case, (get, contexts) in blocks.items():
        for label, op in (("idle", nothing), ("ops", get)):
            gc.collect()
            lib.bench_zero()
            run(op, contexts)
            lib.bench_dump(f"{case}|{label}".encode())


if __name__ == "__main__":
    main()
