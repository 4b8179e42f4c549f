"""Moved to :mod:`django_mcpatterns.core.client.aio`; this path keeps importing."""

from .client import cluster as _sync_driver  # noqa: F401 (an AsyncCluster's sync twin)
from .client.aio import *  # noqa: F403
from .client.aio import __all__  # noqa: F401
