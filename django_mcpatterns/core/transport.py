"""Moved to :mod:`django_mcpatterns.core.client.transport` and ``.pool``: this path imports."""

from .client import pool, transport
from .client.pool import *  # noqa: F403
from .client.transport import *  # noqa: F403

__all__ = [*transport.__all__, *pool.__all__]
