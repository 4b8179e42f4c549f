"""Moved to :mod:`django_mcpatterns.core.client.replicas`; this path keeps importing."""

from .client.replicas import *  # noqa: F403
from .client.replicas import __all__  # noqa: F401
