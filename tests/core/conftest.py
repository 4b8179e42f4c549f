"""Fixtures of the core tests: one fake clock shared by the store and the algorithm."""

from __future__ import annotations

import pytest

from django_mcpatterns.core.memory import MemoryStore
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
