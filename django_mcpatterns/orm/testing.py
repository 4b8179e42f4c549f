"""For test suites: the ORM cache's hooks installed for a while, without the app in settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from . import queryset, writes

__all__ = ["installed"]


@contextmanager
def installed() -> Iterator[None]:
    """Install the queryset methods and write hooks; remove them afterwards."""
    queryset.install()
    writes.install()
    try:
        yield
    finally:
        writes.uninstall()
        queryset.uninstall()
