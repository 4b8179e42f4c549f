"""Moved to :mod:`django_mcpatterns.core.protocol.wire`; this path keeps importing."""

from .protocol.wire import *  # noqa: F403
from .protocol.wire import __all__  # noqa: F401
