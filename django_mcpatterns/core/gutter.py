"""Moved to :mod:`django_mcpatterns.core.client.gutter`; this path keeps importing."""

from .client.gutter import *  # noqa: F403
from .client.gutter import __all__  # noqa: F401
