"""Measure the shape of the package: the figures docs/architecture.md keeps itself to.

    .venv/bin/python scripts/house.py            # imports, cycles, sizes
    .venv/bin/python scripts/house.py --walk     # also the modules a warm cache.sadd runs
                                                 # (starts a memcached on a free loopback port)

What it counts:

* private imports: a ``_name`` (function, class, constant; not a module) imported
  from another module of the package;
* import cycles: strongly connected groups of modules in the import graph (every
  import, at module level, under ``TYPE_CHECKING`` or inside a function);
* sizes: hand-written modules over 400 and 600 lines (generated ones, which start
  with ``# Generated from``, are listed apart);
* the walk (``--walk``): the package's modules whose code runs for one warm
  ``cache.sadd("k", "m")`` on the Django cluster backend, and for one
  ``cache.get_or_compute`` on a cold miss, traced with ``sys.setprofile``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_mcpatterns"
GENERATED = "# Generated from"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(current: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def imports(known: dict[str, Path]) -> dict[str, set[tuple[str, str | None]]]:
    """module -> {(imported module, name or None)} for every import of the package."""
    found: dict[str, set[tuple[str, str | None]]] = defaultdict(set)
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "django_mcpatterns":
                        found[name].add((alias.name, None))
            elif isinstance(node, ast.ImportFrom):
                source = resolve(name, is_package, node.level, node.module)
                if source.split(".")[0] != "django_mcpatterns":
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in known:
                        found[name].add((submodule, None))
                    else:
                        found[name].add((source, alias.name))
    return found


def private_imports(graph: dict[str, set[tuple[str, str | None]]]) -> list[str]:
    rows = []
    for module, targets in sorted(graph.items()):
        for source, imported in sorted(targets, key=str):
            if imported and imported.startswith("_") and not imported.startswith("__"):
                rows.append(f"{module}: {imported} from {source}")
    return rows


def cycles(
    graph: dict[str, set[tuple[str, str | None]]], known: dict[str, Path]
) -> list[list[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        for source, _ in targets:
            if source in known and source != module:
                edges[module].add(source)
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in list(known):
        if v not in index:
            visit(v)
    return found


def sizes(known: dict[str, Path]) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    hand, generated = [], []
    for name, path in known.items():
        text = path.read_text(encoding="utf-8")
        count = len(text.splitlines())
        (generated if text.startswith(GENERATED) else hand).append((count, name))
    return sorted(hand, reverse=True), sorted(generated, reverse=True)


def walk() -> None:
    """Trace the package's modules that run for a warm sadd and a cold get_or_compute."""
    sys.path.insert(0, str(ROOT))
    import django
    from django.conf import settings

    from tests.harness import memcached_cluster

    with memcached_cluster(1) as servers:
        settings.configure(
            CACHES={
                "default": {
                    "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
                    "LOCATION": [s.spec for s in servers],
                }
            },
            INSTALLED_APPS=["django_mcpatterns"],
        )
        django.setup()
        from django.core.cache import cache

        def traced(call: object) -> list[str]:
            seen: set[str] = set()
            prefix = str(PACKAGE)

            def profile(frame, event, arg):  # type: ignore[no-untyped-def]
                filename = frame.f_code.co_filename
                if event == "call" and filename.startswith(prefix):
                    seen.add(module_name(Path(filename)))

            sys.setprofile(profile)
            try:
                call()  # type: ignore[operator]
            finally:
                sys.setprofile(None)
            return sorted(seen)

        cache.sadd("walk:set", "warm-up")
        cache.get_or_compute("walk:warm", lambda: 1, 60)
        rows = {
            'cache.sadd("k", "m"), warm': traced(lambda: cache.sadd("walk:set", "m")),
            "cache.get_or_compute, cold miss": traced(
                lambda: cache.get_or_compute("walk:cold", lambda: 1, 60)
            ),
        }
        for label, seen in rows.items():
            print(f"{label}: {len(seen)} modules")
            for name in seen:
                print(f"    {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--walk", action="store_true", help="also trace cache.sadd")
    parser.add_argument("--all", action="store_true", help="list every private import")
    args = parser.parse_args()
    known = modules()
    graph = imports(known)
    private = private_imports(graph)
    print(f"private imports across modules: {len(private)}")
    for row in private if args.all else private[:10]:
        print(f"    {row}")
    if len(private) > 10 and not args.all:
        print(f"    ... ({len(private) - 10} more: --all)")
    groups = cycles(graph, known)
    print(f"import cycles: {len(groups)}")
    for group in groups:
        print(f"    {' <-> '.join(group)}")
    hand, generated = sizes(known)
    print(f"hand-written modules: {len(hand)}, largest {hand[0][1]} ({hand[0][0]} lines)")
    print(f"    over 600 lines: {', '.join(f'{n} ({c})' for c, n in hand if c > 600) or 'none'}")
    print(f"    over 400 lines: {sum(1 for c, _ in hand if c > 400)}")
    print(f"generated modules: {len(generated)}")
    if args.walk:
        walk()


if __name__ == "__main__":
    main()
