"""Real memcached (and nutcracker) processes for the tests, on free loopback ports.

Processes are started and stopped by their own pid (:mod:`tests.processes`, not
mirakuru: see there why), waiting until the TCP port answers.  When a binary is
missing the tests skip with a loud reason, except under ``CI=true``, where a
missing server is a failure.

Also here: :func:`cluster_on` (a Cluster on flushed servers); probes that look
at the servers behind our clients' back (a plain pymemcache client, the TTL
memcached holds, who holds a key, the ``stats`` counters); and
:func:`serve_example`, which runs an example the way its docs say.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
from pymemcache.client.base import Client

from django_mcpatterns.core.keys import Key, placed
from tests.processes import MEMCACHED_STOP, ServerProcess

if TYPE_CHECKING:
    from django_mcpatterns.core.cluster import Cluster

LOOPBACK = "127.0.0.1"
# Socket timeouts for clients of live servers in tests that are not about timeouts.
PATIENCE = 10.0
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
ROOT = Path(__file__).resolve().parents[1]


def missing(reason: str) -> NoReturn:
    """Skip loudly for a missing test dependency; fail under CI, where nothing may be missing."""
    if IN_CI:
        pytest.fail(reason, pytrace=False)
    pytest.skip(f"!!! SKIPPED: {reason}")


def require_binary(name: str, package: str | None = None) -> str:
    """Return the path of ``name``; skip (fail under CI) when it is not installed."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if path:
        return path
    missing(
        f"{name} is not installed: these tests need a real {name} "
        f"(apt-get install -y {package or name}); scripts/test.sh installs it"
    )


def require_module(name: str, install: str) -> ModuleType:
    """Import ``name``; skip (fail under CI) when it is missing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"{name} is not importable: these tests need a real {name} ({install})")


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether memcached could listen on ``port`` on loopback.

    Binds with ``SO_REUSEADDR``, as memcached does: connections of a previous
    run in TIME_WAIT do not keep the port from it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


@dataclass
class MemcachedServer:
    """One memcached process; ``spec`` is the ``host:port`` string clients use."""

    port: int
    extra_args: Sequence[str] = ()
    memory_mb: int = 64
    executor: ServerProcess | None = field(default=None, repr=False)

    @property
    def spec(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.executor.pid if self.executor else None

    def command(self) -> list[str]:
        cmd = [
            require_binary("memcached"),
            "-l",
            LOOPBACK,
            "-p",
            str(self.port),
            "-U",
            "0",
            "-m",
            str(self.memory_mb),
            "-t",
            "2",
            *self.extra_args,
        ]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]  # memcached refuses to run as root without -u
        return cmd

    def start(self) -> MemcachedServer:
        self.executor = ServerProcess(
            self.command(), (LOOPBACK, self.port), name="memcached", stop_signal=MEMCACHED_STOP
        )
        self.executor.start()
        return self

    def stop(self) -> None:
        if self.executor is not None:
            self.executor.stop()

    def kill(self) -> None:
        """SIGKILL: the server dies without closing anything cleanly."""
        if self.executor is not None:
            self.executor.kill()

    def pause(self) -> None:
        """SIGSTOP: a hung server that accepts connections but never answers.

        The signal is delivered asynchronously: wait until every thread of the
        process is stopped, or a request sent right after could still be served.
        """
        os.kill(self.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        tasks = Path(f"/proc/{self.pid}/task")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                states = [
                    (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    for task in tasks.iterdir()
                ]
            except OSError:
                return  # no /proc, or a thread just exited: the signal is on its way
            if all(state in ("T", "t") for state in states):
                return
            time.sleep(0.001)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)  # type: ignore[arg-type]

    def restart(self) -> None:
        self.stop()
        self.start()

    def flush(self) -> None:
        with socket.create_connection((LOOPBACK, self.port), timeout=5) as sock:
            sock.sendall(b"flush_all\r\n")
            assert sock.recv(64) == b"OK\r\n"


def start_memcached(
    count: int, *, ports: Sequence[int] | None = None, extra_args: Sequence[str] = ()
) -> list[MemcachedServer]:
    """Start ``count`` memcached servers on free (or the given) loopback ports."""
    require_binary("memcached")
    fixed = list(ports or [])
    servers: list[MemcachedServer] = []
    try:
        for port in fixed:
            servers.append(MemcachedServer(port, extra_args=extra_args).start())
        while len(servers) < count:
            servers.append(_start_on_a_free_port(servers, extra_args))
    except BaseException:
        stop_all(servers)
        raise
    return servers


def _start_on_a_free_port(
    started: Sequence[MemcachedServer], extra_args: Sequence[str], attempts: int = 3
) -> MemcachedServer:
    """Start one server on a free port, trying another if someone took it meanwhile.

    ``free_port`` releases the port before memcached binds it, so a process
    elsewhere on the machine can win it in between (seen under parallel runs).
    """
    taken = {server.port for server in started}
    for attempt in range(attempts):
        port = free_port()
        if port in taken:
            continue
        try:
            return MemcachedServer(port, extra_args=extra_args).start()
        except Exception:
            if attempt == attempts - 1 or port_is_free(port):
                raise  # not a lost race for the port: a real failure
    raise RuntimeError("no free loopback port for memcached")


def stop_all(servers: Sequence[MemcachedServer]) -> None:
    for server in servers:
        with contextlib.suppress(Exception):
            server.stop()


@contextlib.contextmanager
def memcached_cluster(count: int, **kwargs) -> Iterator[list[MemcachedServer]]:
    servers = start_memcached(count, **kwargs)
    try:
        yield servers
    finally:
        stop_all(servers)


@contextlib.contextmanager
def cluster_on(servers: Sequence[MemcachedServer]) -> Iterator[Cluster]:
    """A :class:`Cluster` on ``servers``, flushed first and closed after.

    Its timeouts are generous: these servers are live, and a loaded machine can
    keep an answer (or a connect) past the default second; a test about timeouts
    builds its own cluster.
    """
    # Imported here: every test session loads the harness, and only some need a Cluster.
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.options import ClusterOptions

    for server in servers:
        server.flush()
    options = ClusterOptions(timeout=PATIENCE, connect_timeout=PATIENCE)
    cluster = Cluster([server.spec for server in servers], options)
    try:
        yield cluster
    finally:
        cluster.close()


# -- nutcracker (twemproxy): a text-protocol proxy in front of memcached ----------


@dataclass
class Nutcracker:
    """One nutcracker (twemproxy 0.5.0) process: ketama (``hash: md5``) over ``servers``.

    ``spec`` is the address clients use, with ``OPTIONS["protocol"] = "text"``:
    nutcracker passes the text protocol's data commands and closes the
    connection on meta commands, ``flush_all`` and ``stats``.
    """

    servers: Sequence[MemcachedServer]
    directory: Path
    port: int = 0
    executor: ServerProcess | None = field(default=None, repr=False)

    @property
    def spec(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Nutcracker:
        binary = require_binary("nutcracker")
        self.port, stats_port = free_port(), free_port()
        config = self.directory / "nutcracker.yml"
        config.write_text(
            "pool:\n"
            f"  listen: {self.spec}\n"
            "  hash: md5\n"
            "  distribution: ketama\n"
            "  auto_eject_hosts: false\n"
            "  timeout: 5000\n"
            "  servers:\n" + "".join(f"    - {server.spec}:1\n" for server in self.servers)
        )
        command = [binary, "-c", str(config), "-a", LOOPBACK, "-s", str(stats_port)]
        command += ["-o", str(self.directory / "nutcracker.log")]
        command += ["-p", str(self.directory / "nutcracker.pid")]
        self.executor = ServerProcess(command, (LOOPBACK, self.port), name="nutcracker")
        self.executor.start()
        return self

    def stop(self) -> None:
        if self.executor is not None:
            self.executor.stop()

    def flush(self) -> None:
        """Flush the servers behind it (nutcracker does not pass ``flush_all``)."""
        for server in self.servers:
            server.flush()


@contextlib.contextmanager
def nutcracker_on(servers: Sequence[MemcachedServer], directory: Path) -> Iterator[Nutcracker]:
    """A nutcracker in front of ``servers``, its config and log in ``directory``."""
    proxy = Nutcracker(servers, directory).start()
    try:
        yield proxy
    finally:
        proxy.stop()


# -- probes: what the servers themselves hold and count -------------------------

# Counters that move once per request: keys fetched count one each, storage
# commands (set/add/append/prepend/cas) count in cmd_set.
REQUEST_COUNTERS = ("cmd_get", "cmd_set", "cmd_touch", "delete_hits", "delete_misses")

# Counters that any data command moves: unchanged, they prove that nothing
# reached the servers.
COMMAND_COUNTERS = (
    *REQUEST_COUNTERS,
    *("cmd_meta", "cmd_flush", "incr_hits", "incr_misses", "decr_hits", "decr_misses"),
    *("cas_hits", "cas_misses", "cas_badval"),
)


def raw_client(server: MemcachedServer, **options: Any) -> Client:
    """A plain pymemcache client on one server, bypassing everything of ours."""
    options = {"default_noreply": False, "allow_unicode_keys": True, "timeout": 5, **options}
    return Client((LOOPBACK, server.port), **options)


def server_ttl(server: MemcachedServer, key: str) -> int | None:
    """The remaining TTL memcached reports for a key (-1: never), None when absent."""
    client = raw_client(server)
    try:
        # Meta get with the `t` flag (memcached >= 1.6): "HD t<seconds>" or "EN".
        line = client.raw_command(b"mg " + key.encode() + b" t", end_tokens=b"\r\n")
    finally:
        client.close()
    if line.startswith(b"EN"):
        return None
    assert line.startswith(b"HD"), line
    (flag,) = [token for token in line.split()[1:] if token.startswith(b"t")]
    return int(flag[1:])


def servers_holding(servers: Iterable[MemcachedServer], key: Key) -> list[str]:
    """The specs of the servers that hold ``key`` (a routed key: its bytes), read directly."""
    key = placed(key)[0]
    found = []
    for server in servers:
        client = raw_client(server)
        try:
            if client.get(key) is not None:
                found.append(server.spec)
        finally:
            client.close()
    return found


def server_counters(servers: Iterable[MemcachedServer], names: Sequence[str]) -> Counter[str]:
    """The sum over ``servers`` of the ``stats`` counters ``names``."""
    total: Counter[str] = Counter()
    for server in servers:
        client = raw_client(server)
        try:
            stats = client.stats()
        finally:
            client.close()
        total.update({name: int(stats[name.encode()]) for name in names})
    return total


def server_requests(servers: Iterable[MemcachedServer]) -> int:
    """The requests the servers have answered (:data:`REQUEST_COUNTERS`)."""
    return sum(server_counters(servers, REQUEST_COUNTERS).values())


# -- the examples, started as the docs say ----------------------------------------


def http_get(url: str) -> tuple[int, str]:
    """The status and body of a GET (an error status raises, as ``urlopen`` does).

    Patient: a healthy page of an example on a busy machine took over 5 s once; a page
    that hangs still fails, after three times :data:`PATIENCE`.
    """
    with urllib.request.urlopen(url, timeout=3 * PATIENCE) as response:
        return response.status, response.read().decode()


@contextlib.contextmanager
def serve_example(script: str, **env_vars: str) -> Iterator[tuple[str, str]]:
    """Run ``bash <script>`` from the repository root on a free ``PORT``, as a user would.

    The environment is the test run's without its cache and Django settings
    (``env_vars`` may set them).  Yield the URL and the first page served
    (status 200) once it answers; stop the script's whole process group after.
    """
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"MEMCACHED_SERVERS", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(env_vars, PORT=str(port))
    with serve(["bash", script], ROOT, env, f"http://{LOOPBACK}:{port}/") as served:
        yield served


@contextlib.contextmanager
def serve(
    command: Sequence[str], cwd: Path, env: dict[str, str], url: str, startup: float = 300
) -> Iterator[tuple[str, str]]:
    """Run ``command`` until ``url`` answers 200 (the first run of a script installs the
    project: ``startup`` seconds); yield the URL and that first page, then stop the
    command's whole process group.  Its output goes to a file (a pipe nobody reads would
    fill and hang it), shown when it fails."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # so the whole process group can be stopped
        )

        def printed() -> str:
            output.flush()
            output.seek(0)
            return output.read()[-5000:]

        deadline = time.monotonic() + startup
        try:
            while True:
                if process.poll() is not None:
                    pytest.fail(
                        f"{shlex.join(command)} exited with {process.returncode}:\n{printed()}"
                    )
                try:
                    status, first_page = http_get(url)
                    assert status == 200
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"{shlex.join(command)} did not answer on {url}:\n{printed()}")
                    time.sleep(0.2)
            yield url, first_page
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)


def ttl_over_meta(store: Any, key: Key) -> int | None:
    """The item's TTL read over the meta protocol, also where ``store`` speaks text.

    Text mode cannot read a TTL (``Cluster.ttl`` refuses): tests that check one
    ask a meta twin of the same servers.
    """
    options = getattr(store, "options", None)
    if options is None or options.protocol != "text":
        return store.ttl(key)  # type: ignore[no-any-return]
    from django_mcpatterns.core.cluster import Cluster

    meta = Cluster(store.servers, dataclasses.replace(options, protocol="meta"))
    try:
        return meta.ttl(key)
    finally:
        meta.close()
