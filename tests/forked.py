"""Forked worker processes of the drills: a child that does not end says where it is.

A drill's child that is still running when its parent gives up would otherwise
fail with ``exitcode None`` and nothing else.  Each child calls
:func:`dump_stacks_on_signal` first; :func:`join` then asks a child that did
not end for its stacks (faulthandler writes them to the child's stderr, which
pytest captures and reports) before it kills it and fails the test with what
the kernel says of it.
"""

from __future__ import annotations

import faulthandler
import multiprocessing.process
import os
import signal
import threading
from pathlib import Path

import pytest

STACKS = signal.SIGUSR1


def dump_stacks_on_signal() -> None:
    """In a child: print every thread's Python stack to stderr on :data:`STACKS`."""
    faulthandler.register(STACKS, all_threads=True)


def join(process: multiprocessing.process.BaseProcess, timeout: float) -> None:
    """Wait for ``process``; if it runs past ``timeout`` seconds, fail with where it is."""
    process.join(timeout)
    if process.exitcode is not None or process.pid is None:
        return
    pid = process.pid
    kernel = _kernel_view(pid)
    os.kill(pid, STACKS)
    process.join(5)  # time to write its stacks
    if process.exitcode is None:
        process.kill()
        process.join(5)
    parent = sorted(thread.name for thread in threading.enumerate())
    pytest.fail(
        f"{process.name} (pid {pid}) still ran {timeout} s after it was due to end: {kernel};"
        f" this process's threads: {parent}; its stacks are in the captured stderr",
        pytrace=False,
    )


def _kernel_view(pid: int) -> str:
    proc = Path(f"/proc/{pid}")
    try:
        lines = (proc / "status").read_text().splitlines()
        wchan = (proc / "wchan").read_text() or "?"
    except OSError as exc:
        return f"/proc unreadable ({exc})"
    status = dict(line.split(":\t", 1) for line in lines if ":\t" in line)
    state, threads = status.get("State", "?").strip(), status.get("Threads", "?").strip()
    return f"state {state}, threads {threads}, waiting in {wchan}"
