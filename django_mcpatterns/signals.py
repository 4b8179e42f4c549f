"""Signals sent by django-mcpatterns.

``node_dead`` / ``node_revived``
    A memcached server was marked dead by failover, or answered again.
    Keyword arguments: ``node`` (``"host:port"``), ``error`` (the exception, or
    ``None``).  The sender is the :class:`~django_mcpatterns.core.cluster.Cluster`.
"""

from django.dispatch import Signal

node_dead = Signal()
node_revived = Signal()
