"""The keepalive's documented path: it lives in :mod:`django_mcpatterns.core.stampede`."""

from .stampede import AsyncKeepalive, Keepalive

__all__ = ["AsyncKeepalive", "Keepalive"]
