"""Generate the sync pattern modules from their async source, or check they are current.

Each pattern is written once, as asyncio code in ``_async*.py`` modules of its folder
(``django_mcpatterns/core/<pattern>/``); the sync form beside it, ``_sync*.py``, is this
script's output (see ``docs/architecture.md``).  The Django glue written once in asyncio
(``django_mcpatterns/_async/``) is generated into ``django_mcpatterns/_sync/``.  unasync
(python-trio's, the tool httpcore uses) removes ``async``/``await`` and renames names;
then ruff sorts the imports and formats, so the generated files pass the same checks as
the hand-written ones.

    python scripts/generate_sync.py          # regenerate every _sync*.py after editing _async*.py
    python scripts/generate_sync.py --check  # fail when a _sync*.py is not what its source makes

Renames, besides unasync's own (``__aenter__`` -> ``__enter__``, ...):

* ``_async`` -> ``_sync`` and ``_async_name`` -> ``_sync_name`` (module names in imports);
* ``AsyncName`` -> ``Name`` (``AsyncStore`` -> ``Store``, ``AsyncAppendSets`` -> ``AppendSets``);
* ``async_name`` -> ``name`` (``async_sleep`` -> ``sleep``, and another pattern folder's
  ``async_fill`` -> ``fill``: a folder's ``__init__`` exports both forms; the few operations
  that differ live in hand-written pairs, see ``django_mcpatterns/core/concurrency.py``);
* in the façade (the pattern methods on cache objects, ``django_mcpatterns/patterns/``,
  whose ``_async*.py`` are generated beside them as the core's are, and the Django cache
  API, ``django_mcpatterns/_async/``), names follow Django's a-prefix: a method defined as
  ``async def asadd`` is generated as ``def sadd``, and the host's asyncio attributes (each
  ``aname`` or ``_aname`` that ``django_mcpatterns/patterns/host.py`` defines beside
  ``name`` or ``_name``: ``astore``, ``avalues``...) become their sync twins.

Tests too, as httpcore's are: a test module written once in asyncio,
``tests/<where>/_async/test_<name>.py`` (``async def test_...``, run by the ``asyncio.run``
hook of ``tests/conftest.py``), is generated into ``tests/<where>/_sync/test_<name>.py``
with the same renames; what the two forms of a test need differently (a store's asyncio
face, a fake sleep) comes from hand-written pairs in ``tests/twins.py``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_mcpatterns"
CORE = PACKAGE / "core"
# The Django glue written once in asyncio (stampede_guard's page flow, the cache API): a
# directory pair.
GLUE = (PACKAGE / "_async", PACKAGE / "_sync")
# The pattern methods on cache objects: _async*.py generated beside, as in a pattern folder.
FACADE = PACKAGE / "patterns"
# Sources written with Django's a-prefixed names (see the module docstring).
A_PREFIXED = (FACADE, GLUE[0])
HOST = FACADE / "host.py"
# Test modules written once in asyncio: tests/<where>/_async/test_*.py -> _sync/test_*.py.
TESTS = ROOT / "tests"
HEADER = "# Generated from {source} by scripts/generate_sync.py: do not edit.\n"
RUFF = Path(sys.executable).with_name("ruff")


class _Rule(unasync.Rule):  # type: ignore[misc]
    """unasync's rule, with this project's renames."""

    def __init__(self, renames: dict[str, str] | None = None) -> None:
        super().__init__("/_async/", "/_sync/", {"_async": "_sync", **(renames or {})})

    def _unasync_name(self, name: str) -> str:
        if name in self.token_replacements:
            return str(self.token_replacements[name])
        if name.startswith("_async_"):
            return "_sync_" + name[len("_async_") :]
        if len(name) > 5 and name.startswith("Async") and name[5].isupper():
            return name[5:]
        if len(name) > 6 and name.startswith("async_"):
            return name[6:]
        return name


def _ruff(args: list[str], source: str, filename: Path) -> str:
    done = subprocess.run(
        [str(RUFF), *args, "--stdin-filename", str(filename), "-"],
        input=source,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"ruff {' '.join(args)} failed on {filename}:\n{done.stderr}")
    return done.stdout


def host_pairs() -> dict[str, str]:
    """``aname`` -> ``name`` (``_aname`` -> ``_name``) for each pair the pattern host defines."""
    defined = {
        node.name
        for node in ast.walk(ast.parse(HOST.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    found = {}
    for name in defined:
        sync = "_" + name[2:] if name.startswith("_a") else name[1:]
        if name.lstrip("_").startswith("a") and sync in defined:
            found[name] = sync
    return found


def a_forms(text: str) -> dict[str, str]:
    """The façade's renames for a source: its ``async def a<name>`` methods, the host's pairs."""
    methods = re.findall(r"\basync def (a[a-z]\w*)", text)
    return {**host_pairs(), **{name: name[1:] for name in methods}}


def pairs() -> list[tuple[Path, Path]]:
    """Every (async source, sync target): ``core/<pattern>/_async*.py``, the façade's
    ``patterns/_async*.py`` and the glue's pair."""
    found = [
        (source, source.with_name("_sync" + source.name[len("_async") :]))
        for source in sorted([*CORE.glob("*/_async*.py"), *FACADE.glob("_async*.py")])
    ]
    source_dir, target_dir = GLUE
    found += [(source, target_dir / source.name) for source in sorted(source_dir.glob("*.py"))]
    found += [
        (source, source.parent.with_name("_sync") / source.name)
        for source in sorted(TESTS.glob("**/_async/test_*.py"))
    ]
    return found


def generated() -> list[Path]:
    """The generated files there are now (to find those left from a removed source)."""
    return sorted(
        [
            *CORE.glob("*/_sync*.py"),
            *FACADE.glob("_sync*.py"),
            *GLUE[1].glob("*.py"),
            *TESTS.glob("**/_sync/test_*.py"),
        ]
    )


def generate(source: Path, target: Path) -> str:
    """The sync module ``target`` that ``source`` (an asyncio module) makes."""
    text = source.read_text(encoding="utf-8")
    renames = a_forms(text) if source.parent in A_PREFIXED else {}
    tokens = tokenize_rt.src_to_tokens(text)
    text = tokenize_rt.tokens_to_src(_Rule(renames)._unasync_tokens(tokens))
    where = PACKAGE if source.is_relative_to(PACKAGE) else ROOT
    text = HEADER.format(source=source.relative_to(where).as_posix()) + text
    text = _ruff(
        ["check", "--fix", "--select", "I,F401,RUF022", "--quiet", "--exit-zero"], text, target
    )
    return _ruff(["format", "--quiet"], text, target)


def expected() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    return {target: generate(source, target) for source, target in pairs()}


def stale() -> list[Path]:
    """The generated files that are missing, out of date, or left from a removed source."""
    wanted = expected()
    wrong = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    leftovers = [path for path in generated() if path not in wanted]
    return sorted(wrong + leftovers)


def main(argv: list[str]) -> int:
    if "--check" in argv:
        paths = stale()
        for path in paths:
            print(
                f"{path.relative_to(ROOT)} is not generated from its _async source", file=sys.stderr
            )
        if paths:
            print("run: python scripts/generate_sync.py", file=sys.stderr)
        return 1 if paths else 0
    wanted = expected()
    for path in generated():
        if path not in wanted:
            path.unlink()
            print(f"removed {path.relative_to(ROOT)}")
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
