"""The soft-expiry envelope's documented path: it lives in :mod:`django_mcpatterns.core.values`."""

from .values.envelope import *  # noqa: F403
from .values.envelope import __all__ as __all__
