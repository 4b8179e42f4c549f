"""Parse server specifications: ``host:port``, ``host:port:weight``, unix sockets.

Accepted forms (the ones pylibmc, Django and twemproxy configurations use)::

    "10.0.0.1:11211"           host and port, weight 1
    "10.0.0.1:11211:3"         weight 3
    "10.0.0.1:11211:3 cache1"  twemproxy's server name (used by its ketama points)
    "cache.example"            port 11211
    "[::1]:11211"              IPv6 literal
    "unix:/run/memcached.sock" or "/run/memcached.sock"

A ``LOCATION`` is a list of those or one string separated by ``;`` or ``,``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..exceptions import ConfigurationError

__all__ = ["DEFAULT_PORT", "Server", "as_servers", "parse_server", "parse_servers"]

DEFAULT_PORT = 11211


@dataclass(frozen=True)
class Server:
    """One memcached server.  ``node`` is the string ketama routing hashes."""

    host: str
    port: int | None = DEFAULT_PORT  # None for a unix socket
    weight: int = 1
    name: str | None = None

    @property
    def is_unix(self) -> bool:
        return self.port is None

    @property
    def node(self) -> str:
        """``host:port`` (IPv6 hosts in brackets), or the socket path."""
        if self.port is None:
            return self.host
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def address(self) -> str | tuple[str, int]:
        """What a connection opens: a socket path or ``(host, port)``."""
        return self.host if self.port is None else (self.host, self.port)

    def __str__(self) -> str:
        return self.node


def _positive_int(text: str, what: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0 or str(value) != text.strip():
        raise ConfigurationError(
            f"invalid {what} {text!r} in server {spec!r}: expected a positive integer",
            option="LOCATION",
        )
    return value


def parse_server(spec: str) -> Server:
    """Parse one server specification, or raise :class:`ConfigurationError`."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigurationError(
            f"invalid server {spec!r}: expected 'host:port'", option="LOCATION"
        )
    text = spec.strip()
    head, _, rest = text.partition(" ")
    name = rest.strip() or None
    if name is not None and " " in name:
        raise ConfigurationError(f"invalid server {spec!r}: a name is one word", option="LOCATION")
    if head.startswith(("unix:", "/")):
        path = head.removeprefix("unix:")
        if not path:
            raise ConfigurationError(
                f"invalid server {spec!r}: empty socket path", option="LOCATION"
            )
        return Server(host=path, port=None, name=name)
    if head.startswith("["):
        host, sep, rest = head[1:].partition("]")
        if not sep or not host:
            raise ConfigurationError(f"invalid server {spec!r}: unclosed '['", option="LOCATION")
        parts = rest.removeprefix(":").split(":") if rest else []
        if rest and not rest.startswith(":"):
            raise ConfigurationError(f"invalid server {spec!r}", option="LOCATION")
    else:
        host, *parts = head.split(":")
    if not host:
        raise ConfigurationError(f"invalid server {spec!r}: empty host", option="LOCATION")
    if len(parts) > 2:
        raise ConfigurationError(
            f"invalid server {spec!r}: expected 'host:port' or 'host:port:weight'",
            option="LOCATION",
        )
    port = _positive_int(parts[0], "port", spec) if parts else DEFAULT_PORT
    if port > 65535:
        raise ConfigurationError(f"invalid port {port} in server {spec!r}", option="LOCATION")
    weight = _positive_int(parts[1], "weight", spec) if len(parts) == 2 else 1
    return Server(host=host, port=port, weight=weight, name=name)


def parse_servers(location: str | Sequence[str]) -> tuple[Server, ...]:
    """Parse a ``LOCATION``: a list of specs or one string split on ``;`` or ``,``."""
    if isinstance(location, str):
        specs = [s for s in location.replace(",", ";").split(";") if s.strip()]
    else:
        specs = list(location)
    if not specs:
        raise ConfigurationError("no memcached servers configured", option="LOCATION")
    servers = tuple(parse_server(spec) for spec in specs)
    seen: set[str] = set()
    for server in servers:
        if server.node in seen:
            raise ConfigurationError(f"server {server.node} is listed twice", option="LOCATION")
        seen.add(server.node)
    return servers


def as_servers(servers: Sequence[str | Server] | str) -> tuple[Server, ...]:
    """``servers`` as Server objects: a ``LOCATION`` string, or a list of specs and Servers."""
    if isinstance(servers, str):
        return parse_servers(servers)
    parsed = tuple(s if isinstance(s, Server) else parse_server(s) for s in servers)
    if not parsed:
        raise ConfigurationError("no memcached servers configured", option="LOCATION")
    nodes = [s.node for s in parsed]
    for node in nodes:
        if nodes.count(node) > 1:
            raise ConfigurationError(f"server {node} is listed twice", option="LOCATION")
    return parsed
