"""Moved to :mod:`django_mcpatterns.core.client.options`; this path keeps importing."""

from .client.options import *  # noqa: F403
from .client.options import __all__  # noqa: F401
