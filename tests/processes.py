"""Server processes for the tests, started and stopped by their own pid only.

Not mirakuru: mirakuru marks each child with ``mirakuru_uuid=<pid>:<uuid4>`` and,
at the exit of ANY Python process that imported it, SIGKILLs every process whose
marker merely CONTAINS that process's pid as a substring (``cleanup_subprocesses``
-> ``processes_with_env``).  With ``pid_max`` 32768 and several test runs on one
machine, a run ending elsewhere killed session memcacheds mid-run (about one pid
in 3,000 matches a given marker).  Here nothing is marked and nothing is killed
but the pid we started.

Each process keeps its output in a file and its exit status; :func:`deaths`
says which servers died without the harness stopping them, so a test that then
fails with ConnectionRefused reports why (conftest adds it to the report).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import IO

Address = tuple[str, int] | str  # (host, port) over TCP, or a unix socket path

# memcached exits on SIGTERM only at its next once-a-second clock tick (half a second
# on average: 3 s for a six-server fixture's teardown); it keeps nothing to save, and
# its clients see the same closed connections either way.
MEMCACHED_STOP = signal.SIGKILL

_STARTED: weakref.WeakSet[ServerProcess] = weakref.WeakSet()
_BURIED: list[str] = []  # deaths found when a fixture stopped an already dead server


class ServerProcess:
    """One server process: started, waited for until ``address`` accepts, stopped by pid."""

    def __init__(
        self,
        command: Sequence[str],
        address: Address,
        *,
        name: str = "",
        env: Mapping[str, str] | None = None,
        output: IO[str] | None = None,
        timeout: float = 10,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.command = list(command)
        self.address = address
        self.name = name or os.path.basename(self.command[0])
        self.env = dict(env) if env is not None else None
        self.timeout = timeout
        self.stop_signal = stop_signal
        self._output = output  # a file, never a pipe: a full pipe would hang the server
        self._log: IO[str] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped = False  # by the harness: an exit then is no death

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> ServerProcess:
        if self._output is None:
            self._log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (kept open: read on death)
        self.stopped = False
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=self._output or self._log, stderr=subprocess.STDOUT
        )
        _STARTED.add(self)
        deadline = time.monotonic() + self.timeout
        while not self._accepts():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} did not start: {self.describe_exit()}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} did not accept on {self.address!r} in time")
            time.sleep(0.01)
        return self

    def _accepts(self) -> bool:
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(1)
            try:
                sock.connect(self.address)
            except OSError:
                return False
            return True

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: int | None = None, timeout: float = 10) -> None:
        """Signal our pid (and no other), wait; SIGKILL when it does not go in ``timeout``.

        ``sig`` defaults to the process's ``stop_signal``: SIGKILL for memcached
        (:data:`MEMCACHED_STOP`), which has nothing to save.
        """
        sig = self.stop_signal if sig is None else sig
        if self.died():
            _BURIED.append(self.death())  # still reported once the fixture is gone
        self.stopped = True
        try:
            if self.process is None or self.process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
                if sig != signal.SIGKILL:
                    self.process.send_signal(signal.SIGCONT)  # a paused server takes it now
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        finally:
            if self._log is not None:  # stopped by us: no death to read it for
                self._log.close()

    def kill(self) -> None:
        """SIGKILL, as a test's deliberate crash: not a death to report."""
        self.stop(signal.SIGKILL)

    def output(self, limit: int = 2000) -> str:
        """The tail of what the process wrote (stdout and stderr)."""
        log = self._log
        if log is None or log.closed:
            return ""
        log.flush()
        log.seek(0)
        return log.read()[-limit:]

    def describe_exit(self) -> str:
        code = self.process.poll() if self.process else None
        if code is None:
            return "still running"
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return f"pid {self.pid} {how}; output: {self.output()!r}"

    def death(self) -> str:
        return f"{self.name} {self.address!r}: {self.describe_exit()}"

    def died(self) -> bool:
        """Exited while the harness still counted on it."""
        return not self.stopped and self.process is not None and self.process.poll() is not None


def deaths() -> list[str]:
    """One line per started server that died on its own (or was killed by someone else)."""
    return [*_BURIED, *(server.death() for server in list(_STARTED) if server.died())]


def forget(pid: int | None) -> None:
    """Drop a drill's deliberate outside kill from :func:`deaths`."""
    _BURIED[:] = [line for line in _BURIED if f"pid {pid} " not in line]
    for server in list(_STARTED):
        if server.pid == pid:
            server.stopped = True
