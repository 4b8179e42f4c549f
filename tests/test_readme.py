"""Every command of the README works exactly as written, from a fresh clone.

The README's ```sh blocks are read from the README itself, a line a command, and each
line is run by bash in a fresh clone of the repository: its files as git has them (tracked,
and untracked but not ignored) copied to a temporary directory, with no ``.venv/``, no
database, nothing built.  Its ``.venv/`` is the one ``bash scripts/run-example.sh`` makes
there, as for a new user, and the later commands (uvicorn, the wheel) run in that one.
Only what a shared machine forces is changed: ports are free loopback ones (``PORT``, which
the README names, memcached's ``-p`` and uvicorn's ``--port``), and each process started is
stopped by its own pid.  Every README command must be claimed by a test here
(:data:`KINDS`): a new command fails until one runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness import IN_CI, LOOPBACK, ROOT, free_port, http_get, require_binary, serve

pytestmark = pytest.mark.slow

FENCE = re.compile(r"^```(\w*)\s*$")
TALLIES = 20

# What each README command is, by its text: each test runs the commands of its kind.
KINDS = {
    "example": re.compile(r"^(MEMCACHED_SERVERS=\S+ )?bash scripts/run-example\.sh\b"),
    "flask example": re.compile(r"^bash scripts/run-flask-example\.sh\b"),
    "tests": re.compile(r"^(PYTEST_WORKERS=\d+ )?bash scripts/test\.sh\b"),
    "memcached": re.compile(r"^for p in [\d ]+; do memcached -d .*; done\b"),
    "uvicorn": re.compile(r"^\.venv/bin/python -m uvicorn "),
    "wheel": re.compile(r"^\.venv/bin/python -m pip wheel "),
    "install": re.compile(r"^pip install "),
}


def readme_commands() -> list[str]:
    """The lines of the README's ```sh blocks, in order (comments and all)."""
    commands, block = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        fence = FENCE.match(line)
        if fence:
            block = not block and fence[1] == "sh"
            continue
        if block and line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return commands


def of_kind(kind: str) -> list[str]:
    return [command for command in readme_commands() if KINDS[kind].match(command)]


def the(kind: str, *, containing: str = "", without: str = "\0") -> str:
    """The README's one command of ``kind`` (with ``containing``, without ``without``)."""
    found = [c for c in of_kind(kind) if containing in c and without not in c]
    assert len(found) == 1, f"the README should have one {kind} command ({containing}): {found}"
    return found[0]


# -- the clone --------------------------------------------------------------------------


def user_env(**extra: str) -> dict[str, str]:
    """A new user's environment: the test run's, without its venv and settings."""
    unset = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in unset | {"MEMCACHED_SERVERS", "PORT"}}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env.update(extra)
    return env


@dataclass
class Clone:
    root: Path
    # A virtualenv of a user's project, made by the user's python3 while the first commands
    # run: the README's install commands run in it.
    project: Path
    making_project: subprocess.Popen[bytes]
    ports: dict[str, str] = field(default_factory=dict)  # the README's ports -> free ones
    daemons: list[int] = field(default_factory=list)  # pids of the memcached it started

    def env(self, **extra: str) -> dict[str, str]:
        return user_env(**extra)

    def local(self, command: str) -> str:
        """``command`` with the README's ports replaced by this run's free ones."""
        for theirs, ours in self.ports.items():
            command = re.sub(rf"\b{theirs}\b", ours, command)
        return command

    def run(self, command: str, *, timeout: float = 600, **env: str) -> str:
        """Run one README command with bash, as written (ports aside); its output."""
        result = subprocess.run(
            ["bash", "-c", self.local(command)],
            cwd=self.root,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, f"{command}\n{result.stdout}{result.stderr}"
        return result.stdout + result.stderr

    def serve(self, command: str, url: str, **env: str) -> Any:
        return serve(["bash", "-c", self.local(command)], self.root, self.env(**env), url)


def copy_checkout(target: Path) -> None:
    """The repository's files as a fresh clone has them (and files not committed yet)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # a file deleted but not yet committed is listed too
            (target / source.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / source.relative_to(ROOT))


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clone]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        if IN_CI:
            pytest.fail("tests/test_readme.py copies the checkout with git: no git checkout")
        pytest.skip("not a git checkout: nothing to clone")
    root = tmp_path_factory.mktemp("clone") / "django-mcpatterns"
    copy_checkout(root)
    project = root.parent / "project-venv"
    python = shutil.which("python3", path=user_env()["PATH"]) or sys.executable
    making = subprocess.Popen(
        [python, "-m", "venv", str(project)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    made = Clone(root, project, making)
    try:
        yield made
    finally:
        made.making_project.wait(timeout=300)
        for pid in made.daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root.parent, ignore_errors=True)  # its venvs: hundreds of MB a run


@pytest.fixture(scope="module")
def first_run(clone: Clone) -> tuple[str, Path]:
    """The README's first command, which makes the clone's ``.venv/`` and database."""
    command = the("example", without="MEMCACHED_SERVERS=")
    port = free_port()
    with clone.serve(command, f"http://{LOOPBACK}:{port}/", PORT=str(port)) as (url, page):
        assert http_get(url + "status/")[0] == 200
    return page, clone.root / ".venv"


@pytest.fixture(scope="module")
def readme_memcached(clone: Clone, first_run: Any) -> list[str]:
    """The README's memcached servers, started by its own loop on free ports."""
    require_binary("memcached")
    command = the("memcached")
    theirs = re.search(r"for p in ([\d ]+);", command)[1].split()  # type: ignore[index]
    clone.ports.update({port: str(free_port()) for port in theirs})
    ports = [clone.ports[port] for port in theirs]
    clone.run(command)
    for port in ports:
        clone.daemons += pids_listening(command, port)
    assert len(clone.daemons) == len(ports), f"memcached not found on {ports}"
    for port in ports:  # a daemon binds its port after the loop has moved on
        for _ in range(500):
            try:
                socket.create_connection((LOOPBACK, int(port)), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
    return ports


def pids_listening(command: str, port: str) -> list[int]:
    """The pids of the memcached daemons the README's loop started on ``port``."""
    wanted = ["memcached", *re.search(r"memcached (.*?);", command)[1].split()]  # type: ignore[index]
    wanted = [port if arg == "$p" else arg for arg in wanted]
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().decode().split("\0")[:-1]
            except OSError:
                continue
            if argv and Path(argv[0]).name == "memcached" and argv[1:] == wanted[1:]:
                pids.append(int(proc.name))
    return pids


def flush(ports: list[str]) -> None:
    for port in ports:
        with socket.create_connection((LOOPBACK, int(port)), timeout=5) as sock:
            sock.sendall(b"flush_all\r\n")
            assert sock.recv(64) == b"OK\r\n"


def items(ports: list[str]) -> int:
    total = 0
    for port in ports:
        with socket.create_connection((LOOPBACK, int(port)), timeout=5) as sock:
            sock.sendall(b"stats\r\n")
            reply = b""
            while not reply.endswith(b"END\r\n"):
                reply += sock.recv(65536)
        total += int(re.search(rb"STAT curr_items (\d+)", reply)[1])  # type: ignore[index]
    return total


# -- the commands -----------------------------------------------------------------------


def test_every_readme_command_is_run_here() -> None:
    commands = readme_commands()
    assert len(commands) >= 8
    unclaimed = [c for c in commands if not any(kind.match(c) for kind in KINDS.values())]
    assert not unclaimed, f"README commands no test runs (add them to KINDS): {unclaimed}"


def test_the_first_command_serves_the_example_on_the_embedded_cache(
    first_run: tuple[str, Path],
) -> None:
    page, venv = first_run
    assert "LocMemPatternsCache" in page
    assert "Community report" in page
    assert (venv / "bin" / "python").exists()


def test_the_test_commands_are_what_ci_runs() -> None:
    """``bash scripts/test.sh`` runs the whole suite (this test among it): CI runs it.  The
    README's other forms add pytest arguments: files that exist, markers that are declared."""
    commands = of_kind("tests")
    assert "bash scripts/test.sh" in [c.split("#")[0].strip() for c in commands]
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    markers = {line.split(":")[0].strip() for line in pytest_ini("markers")}
    for command in commands:
        words = [w for w in shlex.split(command, comments=True) if not re.match(r"^\w+=", w)]
        assert words[:2] == ["bash", "scripts/test.sh"], command
        arguments = iter(words[2:])
        for word in arguments:
            if word == "-m":
                named = set(re.findall(r"\w+", next(arguments))) - {"not", "and", "or"}
                assert named <= markers, f"{command}: undeclared markers {named - markers}"
            elif not word.startswith("-"):
                assert (ROOT / word.split("::")[0]).exists(), f"{command}: no {word}"


def pytest_ini(name: str) -> list[str]:
    """A list setting of [tool.pytest.ini_options] in pyproject.toml."""
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    return list(options["ini_options"][name])


def test_one_variable_runs_the_example_on_the_readmes_memcached(
    clone: Clone, readme_memcached: list[str]
) -> None:
    flush(readme_memcached)
    command = the("example", containing="MEMCACHED_SERVERS=")
    port = free_port()
    with clone.serve(command, f"http://{LOOPBACK}:{port}/", PORT=str(port)) as (_, page):
        assert "KetamaMemcacheCache" in page
    assert items(readme_memcached) >= 2  # the page and its header list (at least)


@pytest.fixture(params=["embedded", "memcached"])
def asgi_site(request: pytest.FixtureRequest, clone: Clone, first_run: Any) -> Iterator[str]:
    """The README's uvicorn line in the clone's venv, after run-example.sh made it."""
    env = {}
    if request.param == "memcached":
        ports: list[str] = request.getfixturevalue("readme_memcached")
        flush(ports)
        env["MEMCACHED_SERVERS"] = ",".join(f"{LOOPBACK}:{port}" for port in ports)
    port = free_port()
    command = re.sub(r"--port \d+", f"--port {port}", the("uvicorn"))
    with clone.serve(command, f"http://{LOOPBACK}:{port}/", **env) as (url, _):
        yield url.rstrip("/")


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as response:
        return response.status, response.read().decode()


def test_sync_pages_work_under_uvicorn(asgi_site: str) -> None:
    status, body = fetch(asgi_site + "/")
    assert status == 200
    assert "members" in body.lower()


def test_async_pages_under_uvicorn(asgi_site: str) -> None:
    first: dict[str, Any] = json.loads(fetch(asgi_site + "/async/")[1])
    assert first["visits"] == 1
    assert first["visitors"] == 1
    assert first["counts"]["members"] > 0
    second: dict[str, Any] = json.loads(fetch(asgi_site + "/async/")[1])
    assert second["visits"] == 2
    assert second["counts"] == first["counts"]  # computed once, then served from the cache

    # Concurrent read-modify-writes under `async with cache.lock(...)`: none is lost.
    with ThreadPoolExecutor(10) as visitors:
        answers = list(visitors.map(lambda _: fetch(asgi_site + "/async/tally/"), range(TALLIES)))
    assert {status for status, _ in answers} == {200}
    assert sorted(json.loads(body)["tally"] for _, body in answers) == list(range(1, TALLIES + 1))

    status, front = fetch(asgi_site + "/async/front/")
    assert status == 200
    assert fetch(asgi_site + "/async/front/")[1] == front  # the stampede-guarded page, cached


def test_the_flask_example(clone: Clone, first_run: Any) -> None:
    port = free_port()
    command = the("flask example")
    with clone.serve(command, f"http://{LOOPBACK}:{port}/", PORT=str(port)) as (url, page):
        assert "Home page views" in page
        status, report = fetch(url + "report")
    assert status == 200
    assert "LocMemPatternsCache" in report


def project_venv(clone: Clone) -> tuple[Path, dict[str, str]]:
    """A virtualenv of the user's project, and the environment with it activated."""
    assert clone.making_project.wait(timeout=300) == 0, "python3 -m venv failed"
    where = clone.project
    env = clone.env(VIRTUAL_ENV=str(where))
    env["PATH"] = f"{where / 'bin'}{os.pathsep}{env['PATH']}"
    return where, env


def installed_in(venv: Path, elsewhere: Path, origin: str) -> Path:
    """Where ``venv``'s Python imports the package from (run outside the clone), checking
    it came from ``origin`` (pip's record of the wheel's path or the checkout's URL)."""
    probe = (
        "import django, django_mcpatterns.backend, pathlib; "
        "print(pathlib.Path(django_mcpatterns.backend.__file__).parent)"
    )
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    package = Path(result.stdout.strip())
    assert venv in package.parents  # installed into the venv, not the clone
    # Package data: the status page's templates and the type marker.
    assert (package / "templates" / "django_mcpatterns" / "status.html").is_file()
    assert (package / "py.typed").is_file()
    record = json.loads(
        next(
            venv.glob("lib/python*/site-packages/django_mcpatterns-*.dist-info/direct_url.json")
        ).read_text()
    )
    assert record["url"].endswith(origin), record
    return package


def test_the_wheel_and_the_checkout_install_as_the_readme_says(
    clone: Clone, first_run: Any, tmp_path: Path
) -> None:
    """Built with the clone's venv; installed, as the README orders them, in a project's
    virtualenv (one: the checkout's install, of the same version, replaces the wheel's)."""
    clone.run(the("wheel"))
    from_wheel = the("install", containing=".whl")
    wheel = re.search(r'"(dist/[^"\[]+\.whl)', from_wheel)[1]  # type: ignore[index]
    assert (clone.root / wheel).is_file(), (
        f"the README installs {wheel}; the build made {sorted(os.listdir(clone.root / 'dist'))}"
    )
    venv, env = project_venv(clone)
    for install, origin in ((from_wheel, wheel), (the("install", containing='".['), "")):
        result = subprocess.run(
            ["bash", "-c", install], cwd=clone.root, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Successfully installed" in result.stdout  # not "already satisfied"
        installed_in(venv, tmp_path, origin or clone.root.as_uri())
