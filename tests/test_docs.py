"""The documentation builds without warnings, and its Python examples run.

Every ```python block of ``docs/*.md`` and ``README.md`` runs on its own, in a
fresh namespace, with Django configured on a fresh embedded cache: a snippet a
reader copies must work as it stands.  A block that cannot run (a shell
session, a fragment) uses another fence language (```text, ```sh).  Snippets
may only reach loopback: a connection elsewhere fails the block.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import subprocess
import sys
import textwrap
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from django.test import override_settings

from tests.harness import require_module
from tests.links import broken, parse

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
EMBEDDED_BACKEND = "django_mcpatterns.backend.LocMemPatternsCache"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first code line
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> Iterator[Block]:
    """The ```python blocks of a Markdown file, dedented, with where they start."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if opening["lang"] == "python":
            yield Block(path, i + 2, textwrap.dedent("\n".join(lines[i + 1 : end])))
        i = end + 1


ALL_BLOCKS = [block for path in DOCUMENTS for block in python_blocks(path)]


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (and refuse) every connection a snippet tries beyond loopback."""
    attempts: list[str] = []
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                local = host == "localhost" or ipaddress.ip_address(host).is_loopback
            except ValueError:
                local = False
            if not local:
                attempts.append(str(host))
                raise ConnectionRefusedError(f"docs snippets may only reach loopback, not {host}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return attempts


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[block.where for block in ALL_BLOCKS])
def test_python_block_runs(block: Block, loopback_only: list[str]) -> None:
    # Padding keeps the file's own line numbers in tracebacks.
    code = compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")
    namespace: dict[str, Any] = {"__name__": f"docs_{block.path.stem}_{block.line}"}
    fresh = {"default": {"BACKEND": EMBEDDED_BACKEND, "LOCATION": f"docs:{block.where}"}}
    try:
        with override_settings(CACHES=fresh):
            exec(code, namespace)
    except Exception:
        pytest.fail(
            f"{block.where}: this ```python block fails:\n{traceback.format_exc()}",
            pytrace=False,
        )
    assert not loopback_only, f"{block.where}: tried to connect to {loopback_only}"


def test_every_document_has_been_read() -> None:
    assert (ROOT / "README.md") in DOCUMENTS
    assert len(ALL_BLOCKS) >= 10


def test_api_reference_names_only_methods_the_cache_has() -> None:
    from django.core.cache import caches

    api = (ROOT / "docs" / "api.md").read_text()
    named = set(re.findall(r"`cache\.(\w+)", api))
    with override_settings(CACHES={"default": {"BACKEND": EMBEDDED_BACKEND}}):
        cache = caches["default"]
        missing = sorted(name for name in named if not hasattr(cache, name))
    assert named
    assert not missing, f"docs/api.md documents cache methods that do not exist: {missing}"


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The docs site as ``mkdocs build --strict`` makes it, and what mkdocs printed."""
    require_module("mkdocs", "pip install -e '.[test]'")
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return site, result.stdout + result.stderr


@pytest.mark.slow
def test_site_builds_without_warnings(built_site: tuple[Path, str]) -> None:
    site, _ = built_site
    assert (site / "index.html").is_file()
    assert (site / "operations" / "index.html").is_file()


@pytest.mark.slow
def test_every_link_of_the_site_leads_to_a_page_of_it_or_another_site(
    built_site: tuple[Path, str],
) -> None:
    """No rendered page links to a path of the repository (``../tests/...``,
    ``docs/x.md``): each relative link is a file of the site, its fragment an id there."""
    site, _ = built_site

    def target(path: str) -> Path:
        file = site / path.lstrip("/")
        return file / "index.html" if path.endswith("/") or file.is_dir() else file

    def serves(path: str) -> bool:
        return target(path).is_file()

    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    ids_of: dict[Path, set[str]] = {}
    problems = []
    for page in pages:
        address = "/" + page.relative_to(site).as_posix()
        html = page.read_text()
        problems += [f"{address}: {link}" for link in broken(html, address, serves)]
        for link in parse(html)[0]:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or not parts.path or not parts.fragment:
                continue
            file = target(urljoin(address, parts.path))
            if file.suffix == ".html" and file.is_file():
                if file not in ids_of:
                    ids_of[file] = parse(file.read_text())[1]
                if parts.fragment not in ids_of[file]:
                    problems.append(f"{address}: {link} (no such anchor)")
    assert not problems, "links the docs site does not serve:\n" + "\n".join(problems)


def test_operations_lists_every_management_command() -> None:
    """docs/operations.md's table names each command the app ships, and no other."""
    shipped = {
        path.stem
        for path in (ROOT / "django_mcpatterns" / "management" / "commands").glob("*.py")
        if path.stem != "__init__"
    }
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("## Management commands", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)` \|", section, re.MULTILINE))
    assert shipped, "no management commands found"
    assert listed == shipped, (
        f"docs/operations.md's Management commands table lists {sorted(listed)}, "
        f"the app ships {sorted(shipped)}"
    )
