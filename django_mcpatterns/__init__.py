"""Memcached caching patterns for Django and Flask.

The framework-free core lives in :mod:`django_mcpatterns.core`; the Django cache
backends in :mod:`django_mcpatterns.backend`.
"""

__version__ = "0.1.0.dev0"
