"""Moved to :mod:`django_mcpatterns.core.client.channel`; this path keeps importing."""

from .client.channel import *  # noqa: F403
from .client.channel import __all__  # noqa: F401
