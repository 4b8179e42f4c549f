"""The drivers: they run the protocol's plans on sockets (``cluster``) and asyncio (``aio``).

Also here: a server's pool, health and fork handling (``node``), the routing
of keys to servers with failover, replicas and the gutter (``routing``,
``routes``, ``replicas``, ``gutter``), the transports (``transport``,
``channel``), and how outcomes are judged (``outcomes``).
"""
