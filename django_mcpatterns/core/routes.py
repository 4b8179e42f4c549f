"""Moved to :mod:`django_mcpatterns.core.client.routes`; this path keeps importing."""

from .client.routes import *  # noqa: F403
from .client.routes import __all__  # noqa: F401
