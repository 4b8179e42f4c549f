"""Moved to :mod:`django_mcpatterns.core.client.health`; this path keeps importing."""

from .client.health import *  # noqa: F403
from .client.health import __all__  # noqa: F401
