"""Moved to :mod:`django_mcpatterns.core.client.transport`; this path keeps importing."""

from .client.transport import *  # noqa: F403
from .client.transport import __all__  # noqa: F401
