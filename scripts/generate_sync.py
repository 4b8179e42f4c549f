"""Generate the sync pattern modules from their async source, or check they are current.

The patterns are written once, as asyncio code in ``django_mcpatterns/core/_async/``;
their sync form in ``django_mcpatterns/core/_sync/`` is this script's output (a pattern
folder's ``core/<pattern>/_async*.py`` makes the ``_sync*.py`` beside it; see
``docs/architecture.md``).  unasync (python-trio's, the tool httpcore uses) removes
``async``/``await`` and renames names; then ruff sorts the imports and formats, so
the generated files pass the same checks as the hand-written ones.

    python scripts/generate_sync.py          # regenerate core/_sync/ after editing core/_async/
    python scripts/generate_sync.py --check  # fail when core/_sync/ is not what _async/ makes (CI)

Renames, besides unasync's own (``__aenter__`` -> ``__enter__``, ...):

* ``_async`` -> ``_sync`` (import paths);
* ``AsyncName`` -> ``Name`` (``AsyncStore`` -> ``Store``, ``AsyncAppendSets`` -> ``AppendSets``);
* ``async_name`` -> ``name`` (``async_sleep`` -> ``sleep``: the few operations that differ
  live in hand-written pairs, see ``django_mcpatterns/core/syncio.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tokenize_rt
import unasync

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_mcpatterns"
SOURCE = PACKAGE / "core" / "_async"
TARGET = PACKAGE / "core" / "_sync"
# Each (source, target) directory pair: the framework-free patterns, and the
# Django glue written once in asyncio (stampede_guard's page flow).
DIRECTORIES = ((SOURCE, TARGET), (PACKAGE / "_async", PACKAGE / "_sync"))
HEADER = "# Generated from {source} by scripts/generate_sync.py: do not edit.\n"
RUFF = Path(sys.executable).with_name("ruff")


class _Rule(unasync.Rule):  # type: ignore[misc]
    """unasync's rule, with this project's renames."""

    def __init__(self) -> None:
        super().__init__("/_async/", "/_sync/", {"_async": "_sync"})

    def _unasync_name(self, name: str) -> str:
        if name in self.token_replacements:
            return str(self.token_replacements[name])
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


def generate(source: Path, target_dir: Path = TARGET) -> str:
    """The sync module that ``source`` (a file in an ``_async/`` directory) makes."""
    tokens = tokenize_rt.src_to_tokens(source.read_text(encoding="utf-8"))
    text = tokenize_rt.tokens_to_src(_Rule()._unasync_tokens(tokens))
    text = HEADER.format(source=source.relative_to(PACKAGE).as_posix()) + text
    target = target_dir / source.name
    text = _ruff(["check", "--fix", "--select", "I,F401", "--quiet", "--exit-zero"], text, target)
    return _ruff(["format", "--quiet"], text, target)


def _pattern_folders() -> dict[Path, Path]:
    """A pattern folder's ``_async*.py`` and the ``_sync*.py`` beside it (core/<pattern>/)."""
    return {
        source.with_name("_sync" + source.name[len("_async") :]): source
        for source in sorted(PACKAGE.glob("core/*/_async*.py"))
    }


def expected() -> dict[Path, str]:
    """Every generated file and the text it must have."""
    wanted = {
        target / source.name: generate(source, target)
        for source_dir, target in DIRECTORIES
        for source in sorted(source_dir.glob("*.py"))
    }
    for target, source in _pattern_folders().items():
        wanted[target] = generate(source, target.parent)
    return wanted


def stale() -> list[Path]:
    """The generated files that are missing, out of date, or left from a removed source."""
    wanted = expected()
    wrong = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    leftovers = [
        path for _, target in DIRECTORIES for path in target.glob("*.py") if path not in wanted
    ]
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
    for _, target in DIRECTORIES:
        target.mkdir(exist_ok=True)
        for path in target.glob("*.py"):
            if path not in wanted:
                path.unlink()
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
