"""Count the system calls a block of code makes in this process, for real.

Two ways, the first that works here:

* ``perf``: ``perf stat -e 'syscalls:sys_enter_*'`` attached to this process, counting only
  while the block runs (its ``--control`` fifo switches the counters on and off).  The
  kernel counts; the process runs at full speed, so what it does is what it does untimed.
  Needs the kernel's syscall tracepoints and the right to use them (root, or
  ``kernel.perf_event_paranoid`` at -1): ``apt-get install linux-perf``.
* ``strace``: ``strace -f`` attached to this process, the block between two marker calls
  (a ``stat`` of a path nobody has).  Each system call stops the process twice, so a
  client that polls a non-blocking socket may see its reply already there more often than
  it would untraced, and make fewer calls: a floor.  ``apt-get install strace``.

A count is the block's calls minus those of an empty block counted the same way (what the
switching itself costs), per operation, by system call name.  With perf, the ``select`` that
waits for perf's acknowledgement (``pselect6``) is left out by name: whether it falls inside
the counted window races with perf switching the counters, so no empty block cancels it
(no client measured here calls ``select``).
"""

from __future__ import annotations

import collections
import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

Counts = dict[str, float]


class CountingError(RuntimeError):
    """The counter could not count this block (it died, or timed out)."""


class Perf:
    """``perf stat`` on the syscall tracepoints, switched on and off through a fifo."""

    name = "perf stat -e 'syscalls:sys_enter_*'"

    def __init__(self, binary: str) -> None:
        self.binary = binary

    @classmethod
    def find(cls) -> Perf | None:
        binary = shutil.which("perf")
        if binary is None:
            return None
        probe = subprocess.run(
            [binary, "stat", "-x", ",", "-e", "syscalls:sys_enter_getpid", "--", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        first = probe.stderr.strip().split(",", 1)[0]
        return cls(binary) if probe.returncode == 0 and first.isdigit() else None

    def count(self, block: Callable[[], object]) -> collections.Counter[str]:
        with tempfile.TemporaryDirectory(prefix="syscalls-") as tmp:
            ctl, ack = os.path.join(tmp, "ctl"), os.path.join(tmp, "ack")
            os.mkfifo(ctl)
            os.mkfifo(ack)
            command = [self.binary, "stat", "-x", ",", "-e", "syscalls:sys_enter_*"]
            command += ["-p", str(os.getpid()), "--control", f"fifo:{ctl},{ack}", "-D", "-1"]
            errors = Path(tmp, "out")
            with errors.open("w") as out:
                perf = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=out)
            try:
                ctl_fd = _open_writer(ctl, perf)
                ack_fd = os.open(ack, os.O_RDONLY)  # perf holds it open by now
                try:
                    _command(ctl_fd, ack_fd, perf, b"enable")
                    block()
                    _command(ctl_fd, ack_fd, perf, b"disable")
                    _stop(perf)  # the fifos stay open until it has printed its counts
                finally:
                    os.close(ctl_fd)
                    os.close(ack_fd)
            finally:
                if perf.poll() is None:
                    perf.kill()
                    perf.wait()
            counts: collections.Counter[str] = collections.Counter()
            for line in errors.read_text().splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[0].isdigit() and int(fields[0]):
                    counts[fields[2].removeprefix("syscalls:sys_enter_")] += int(fields[0])
            counts.pop(_WAIT, None)
            if not counts:
                raise CountingError(f"perf counted nothing: {errors.read_text()[-500:]}")
            return counts


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the counter prints and exits), then SIGTERM; CountingError if it took SIGKILL."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 10)):
        proc.send_signal(sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    proc.wait()
    raise CountingError(f"{proc.args[0]} did not stop")


def _open_writer(path: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> int:
    """Open a fifo for writing once ``proc`` has opened it (a blocking open could hang)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads it yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CountingError(f"{proc.args[0]} did not open its control fifo") from None
            time.sleep(0.01)
            continue
        os.set_blocking(fd, True)
        return fd


_WAIT = "pselect6"  # what select.select calls on Linux


def _command(ctl_fd: int, ack_fd: int, proc: subprocess.Popen[bytes], word: bytes) -> None:
    os.write(ctl_fd, word + b"\n")
    ready, _, _ = select.select([ack_fd], [], [], 30)
    if not ready or not os.read(ack_fd, 64).startswith(b"ack"):
        raise CountingError(f"{proc.args[0]} did not acknowledge {word.decode()}")


# A line of strace's output: "[pid] name(" for a call (or its first half), skipping the
# "<... name resumed>" second halves, signals and exits.
_CALL = re.compile(rb"^(?:\d+\s+)?([a-z_0-9]+)\(")


class Strace:
    """``strace -f`` attached to this process; the block between two marker calls."""

    name = "strace -f (between marker calls)"

    def __init__(self, binary: str) -> None:
        self.binary = binary

    @classmethod
    def find(cls) -> Strace | None:
        binary = shutil.which("strace")
        if binary is None:
            return None
        probe = subprocess.run(
            [binary, "-qq", "-o", "/dev/null", "true"], capture_output=True, check=False
        )
        return cls(binary) if probe.returncode == 0 else None

    def count(self, block: Callable[[], object]) -> collections.Counter[str]:
        marker = f"/nonexistent/syscalls-{os.getpid()}-{time.monotonic_ns()}"
        with tempfile.TemporaryDirectory(prefix="syscalls-") as tmp:
            trace = Path(tmp, "trace")
            command = [self.binary, "-f", "-qq", "-o", str(trace), "-p", str(os.getpid())]
            strace = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _wait_traced_by(strace)
                os.path.exists(marker + "-start")
                block()
                os.path.exists(marker + "-end")
                _stop(strace)  # detaches, then exits
            finally:
                if strace.poll() is None:
                    strace.kill()
                    strace.wait()
            lines = trace.read_bytes().splitlines()
        start = _index(lines, (marker + "-start").encode())
        end = _index(lines, (marker + "-end").encode())
        counts: collections.Counter[str] = collections.Counter()
        for line in lines[start + 1 : end]:
            match = _CALL.match(line)
            if match:
                counts[match.group(1).decode()] += 1
        return counts


def _wait_traced_by(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Wait until ``proc`` traces every thread of this process."""
    deadline = time.monotonic() + timeout
    while True:
        tracers = set()
        for task in Path("/proc/self/task").iterdir():
            status = (task / "status").read_text()
            tracers.add(int(re.search(r"^TracerPid:\s*(\d+)", status, re.M).group(1)))  # type: ignore[union-attr]
        if tracers == {proc.pid}:
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise CountingError("strace did not attach (ptrace not permitted here?)")
        time.sleep(0.01)


def _index(lines: list[bytes], marker: bytes) -> int:
    for i, line in enumerate(lines):
        if marker in line:
            return i
    raise CountingError("strace's output lacks a marker call")


Counter = Perf | Strace


def find_counter(method: str = "auto") -> Counter | None:
    """The first of perf and strace that works here (or the one named); None for "off"."""
    if method == "off":
        return None
    finders: list[Callable[[], Counter | None]] = []
    if method in ("auto", "perf"):
        finders.append(Perf.find)
    if method in ("auto", "strace"):
        finders.append(Strace.find)
    for find in finders:
        counter = find()
        if counter is not None:
            return counter
    return None


class PerOp:
    """System calls per operation of blocks, by a counter, less an empty block's."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self._empty: collections.Counter[str] | None = None

    def __call__(self, fn: Callable[[], object], ops: int) -> Counts:
        """Calls per op of ``ops`` calls of ``fn``; CountingError if two tries failed."""
        if self._empty is None:
            self._empty = self._count(lambda: None)

        def block() -> None:
            for _ in range(ops):
                fn()

        counts = self._count(block)
        counts.subtract(self._empty)
        return {name: n / ops for name, n in counts.items() if n > 0}

    def _count(self, block: Callable[[], object]) -> collections.Counter[str]:
        try:
            return self.counter.count(block)
        except CountingError:  # a busy machine can starve the counter: once more
            return self.counter.count(block)


def total(counts: Counts) -> float:
    return sum(counts.values())


def breakdown(counts: Counts) -> str:
    """``recvfrom 1, sendto 1`` for the calls of one op, most frequent first."""
    return ", ".join(
        f"{name} {n:.2f}".rstrip("0").rstrip(".")
        for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n >= 0.005
    )
