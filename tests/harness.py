"""Real memcached (and nutcracker) processes for the tests, on free loopback ports.

Processes are started and stopped by pid through mirakuru, which waits until the
TCP port answers.  When a binary is missing the tests skip with a loud reason,
except under ``CI=true``, where a missing server is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from mirakuru import TCPExecutor

LOOPBACK = "127.0.0.1"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_binary(name: str, package: str | None = None) -> str:
    """Return the path of ``name``; skip (fail under CI) when it is not installed."""
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin")
    if path:
        return path
    reason = (
        f"{name} is not installed: these tests need a real {name} "
        f"(apt-get install -y {package or name}); scripts/test.sh installs it"
    )
    if IN_CI:
        pytest.fail(reason, pytrace=False)
    pytest.skip(f"!!! SKIPPED: {reason}")


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
    executor: TCPExecutor | None = field(default=None, repr=False)

    @property
    def spec(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        process = self.executor.process if self.executor else None
        return process.pid if process else None

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
        self.executor = TCPExecutor(self.command(), host=LOOPBACK, port=self.port, timeout=10)
        self.executor.start()
        return self

    def stop(self) -> None:
        if self.executor is not None and self.executor.running():
            self.executor.stop()

    def kill(self) -> None:
        """SIGKILL: the server dies without closing anything cleanly."""
        if self.executor is not None:
            self.executor.kill(sig=signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: a hung server that accepts connections but never answers."""
        os.kill(self.pid, signal.SIGSTOP)  # type: ignore[arg-type]

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
    chosen = list(ports) if ports else []
    while len(chosen) < count:
        port = free_port()
        if port not in chosen:
            chosen.append(port)
    servers: list[MemcachedServer] = []
    try:
        for port in chosen:
            servers.append(MemcachedServer(port, extra_args=extra_args).start())
    except BaseException:
        stop_all(servers)
        raise
    return servers


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
