"""The compressors' documented path: they live in :mod:`django_mcpatterns.core.values`."""

from .values.compression import *  # noqa: F403
from .values.compression import __all__ as __all__
