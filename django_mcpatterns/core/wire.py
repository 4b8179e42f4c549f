"""Moved to :mod:`.protocol` (``wire``, ``meta``, ``reader``); this path keeps importing."""

from .protocol import meta, reader, wire
from .protocol.meta import *  # noqa: F403
from .protocol.reader import *  # noqa: F403
from .protocol.wire import *  # noqa: F403

__all__ = [*wire.__all__, *meta.__all__, *reader.__all__]
