"""Moved to :mod:`django_mcpatterns.core.client.servers`; this path keeps importing."""

from .client.servers import *  # noqa: F403
from .client.servers import __all__  # noqa: F401
