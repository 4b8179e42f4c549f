"""Fixtures of the core tests: one fake clock shared by the store and the algorithm; the
compiled exchange's socket pairs, each test run both ways (releasing the GIL, looking first)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.protocol import compiled
from tests.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    """The embedded store on the test's fake clock (tests may override ``store``)."""
    return MemoryStore(clock=clock)


@pytest.fixture
def events() -> list[object]:
    """What the algorithm under test reported through ``on_event``."""
    return []


@pytest.fixture(params=[False, True], ids=["releasing", "looking-first"])
def looking(request: pytest.FixtureRequest) -> Iterator[bool]:
    """The compiled exchange both ways: the GIL released for the whole round trip, and kept
    while the reply is looked for at once (what a process whose near cache answers most
    reads does); the process's own judgement is restored after."""
    if compiled.speedups is None:
        pytest.skip(f"the compiled path is not built: {compiled.why_pure}")
    compiled.speedups.look_first(request.param)
    yield request.param
    compiled.speedups.look_first(None)


@pytest.fixture
def pair(
    looking: bool, request: pytest.FixtureRequest
) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected socket pair: ours with the kernel's bound on each call that transport.py
    sets (the test module's ``PAIR_TIMEOUT``, 0.3 s unless it says), theirs played by the
    test."""
    ours, theirs = socket.socketpair()
    seconds = getattr(request.module, "PAIR_TIMEOUT", 0.3)
    timeval = struct.pack("@ll", int(seconds), int(seconds % 1 * 1_000_000))
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    yield ours, theirs
    ours.close()
    theirs.close()
