"""Moved to :mod:`django_mcpatterns.core.client.cluster`; this path keeps importing."""

from .client.cluster import *  # noqa: F403
from .client.cluster import __all__  # noqa: F401
