"""Cluster options, parsed once into a frozen, validated dataclass.

Every per-cache setting lives in ``OPTIONS`` (Django) or ``CACHE_OPTIONS``
(Flask).  The socket options of the transport (:data:`CLIENT_OPTIONS`:
``no_delay``, ``socket_keepalive``, ``tls_context``, ``socket_module``) may be given
at the top level, as Django's own memcached backends take pymemcache's, or under
``client_options``.  Anything else (pymemcache ``Client`` arguments included:
there is no pymemcache client under the cluster) raises
:class:`ConfigurationError` naming the key and the valid choices.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..exceptions import ConfigurationError
from ..ketama import VARIANTS
from ..keys import LONG_KEYS
from ..observe import check_installed
from ..outages import ON_OUTAGE
from ..values.layout import LARGE_VALUES
from ..values.serde import SerdeOptions
from ..values.serializers import DEFAULT_SERIALIZER
from .gutter import DEFAULT_GUTTER_TTL
from .migration import MigrationSource, check_migrate_from
from .replicas import check_replicate

__all__ = [
    "CLIENT_OPTIONS",
    "FAILOVER_POLICIES",
    "INSTRUMENTATION_OPTIONS",
    "PROTOCOLS",
    "ClusterOptions",
]

FAILOVER_POLICIES = ("miss", "remap", "gutter")
# What OPTIONS["instrumentation"] comes with (docs/operations.md, "Metrics and traces").
INSTRUMENTATION_OPTIONS = frozenset(
    {
        "instrumentation",
        "instrumentation_name",
        "prometheus_registry",
        "tracer_provider",
        "trace_keys",
    }
)
PROTOCOLS = ("meta", "text")

# pymemcache Client arguments that this project decides itself: accepting them
# would break the patterns (noreply) or bypass our routing and serialisation.
_RESERVED_CLIENT_OPTIONS = frozenset(
    {
        "server",
        "serde",
        "serializer",
        "deserializer",
        "default_noreply",
        "key_prefix",
        "ignore_exc",
        "connect_timeout",
        "timeout",
    }
)
# How connections are opened (transport.SocketOptions); ``no_delay`` defaults to True.
CLIENT_OPTIONS = frozenset({"no_delay", "socket_keepalive", "tls_context", "socket_module"})


@dataclass(frozen=True)
class ClusterOptions:
    """How a :class:`~django_mcpatterns.core.cluster.Cluster` routes and fails over.

    ketama
        Which implementation's key→server mapping to reproduce (see
        :data:`~django_mcpatterns.core.ketama.VARIANTS`).
    protocol
        ``"meta"`` (memcached 1.6 and later) or ``"text"``: servers and proxies
        that know only the text protocol (twemproxy, mcrouter, memcached before
        1.6).  Text mode sends no meta command at all (see docs/twemproxy.md).
    failover
        ``"miss"``: a dead server's keys read as misses and writes to them fail.
        ``"remap"``: its keys go to the next live server on the ring.
        ``"gutter"``: its keys are served by the ``gutter`` pool meanwhile, with
        TTLs of at most ``gutter_ttl`` seconds (see :mod:`.gutter`).
    gutter
        The gutter pool's servers (specs as in ``LOCATION``), their own ketama
        ring; required by, and only meaningful with, ``failover="gutter"``.
    gutter_ttl
        The longest TTL of an item in the gutter, in seconds (default 10).
    replicate
        ``{"key prefix": copies}``: keys whose name, as the caller gives it,
        starts with a prefix are kept on ``copies`` distinct servers (see
        :mod:`.replicas`).
    replicate_scope
        A regular expression for what the framework puts before the caller's
        key (the Django and Flask backends set it: ``KEY_PREFIX:version:``);
        skipped before the ``replicate`` prefixes are matched.
    retry_attempts
        Consecutive failures after which a server is marked dead: the one that
        took it out, then each failed probe (the requests in flight when it
        failed count once; see :mod:`.health`).
    retry_timeout
        Seconds after a failure during which the server is not contacted again
        (its operations fail at once instead of piling up timeouts), and the
        first step of a dead server's back-off.
    dead_timeout
        The longest wait between probes of a dead server (the back-off doubles
        from ``retry_timeout`` up to it).
    connect_timeout, timeout
        Socket connect and I/O timeouts in seconds (``None``: block).
    max_pool_size
        Connections kept per server (``None``: as many as threads need).
    pool_idle_timeout
        Seconds after which an idle pooled connection is closed (0: never).
    raise_errors
        Raise :class:`~.exceptions.NodeUnavailableError` into callers instead
        of degrading to misses and failed writes.
    on_outage
        ``"degrade"`` (default): set and list writes, namespace
        invalidations, counter changes, ``mark_stale`` and lock releases never
        raise for an unreachable server; what they could not write is repaired
        before the server serves again (:mod:`..outages`).  ``"raise"``: they
        raise :class:`~.exceptions.NodeUnavailableError`, as before.
    serializer, signed, signing_key, signing_keys
        How values are encoded and whether they are signed: see
        :class:`~.serializers.SerdeOptions` (the keys never show in ``repr``).
    compressor, compress_min_len
        Compression: see :class:`~.serializers.SerdeOptions` and docs/values.md.
    large_values
        ``"refuse"`` (Django's contract: a value over the item size limit is
        not stored, and a failed ``set`` removes the old one) or ``"chunk"``
        (stored in chunks: :mod:`.chunks`).  Applied by the backends' cache API.
    long_keys
        ``"refuse"`` (keys over 250 bytes are invalid, Django's contract) or
        ``"hash"`` (they become a digest form under the limit; :mod:`.keys`).
        Applied by the Django and Flask backends, which make the keys.
    max_item_size
        The servers' item size limit (memcached's ``-I``, 1 MiB by default),
        in bytes: with ``large_values="chunk"``, values over it are stored in
        chunks that fit.
    instrumentation
        What to report each request, pattern call and event to: a list of
        ``"prometheus"`` (metrics, :mod:`.metrics`) and ``"opentelemetry"``
        (spans, :mod:`.traces`); empty (the default) costs nothing.  A name
        whose package is missing raises, naming the extra to install.
    instrumentation_name
        The ``cache`` label of metrics and spans (the Django backend uses its
        alias when this is not given).
    prometheus_registry
        The ``prometheus_client`` registry for the metrics (default: the
        default registry).
    tracer_provider
        The OpenTelemetry ``TracerProvider`` for the spans (default: the
        global one, ``opentelemetry.trace.set_tracer_provider``).
    trace_keys
        Record keys in spans (``db.query.text``); off, because keys often hold
        user ids.  Values are never recorded.
    migrate_from
        The ring this cache migrates from, and the rollout's stage (see
        :mod:`.migration`); applied by the binding, not by the cluster.
    client_options
        Socket options of every connection (:data:`CLIENT_OPTIONS`):
        ``no_delay`` (``TCP_NODELAY``, default True), ``socket_keepalive``
        (pymemcache's ``KeepaliveOpts`` or any object with ``idle``, ``intvl``
        and ``cnt``), ``tls_context`` (an :class:`ssl.SSLContext`) and
        ``socket_module`` (a stand-in for :mod:`socket`, for tests).
    """

    ketama: str = "libmemcached"
    failover: str = "miss"
    retry_attempts: int = 2
    retry_timeout: float = 1.0
    dead_timeout: float = 30.0
    connect_timeout: float | None = 1.0
    timeout: float | None = 1.0
    max_pool_size: int | None = None
    pool_idle_timeout: float = 0.0
    raise_errors: bool = False
    on_outage: str = "degrade"
    # Which protocol the servers are spoken to in (PROTOCOLS).
    protocol: Literal["meta", "text"] = "meta"
    serializer: str = DEFAULT_SERIALIZER
    signed: bool | None = None
    signing_key: str | bytes | None = field(default=None, repr=False)
    signing_keys: Any = field(default=(), repr=False)
    compressor: str | None = None
    compress_min_len: int | None = None
    large_values: str = "refuse"
    long_keys: str = "refuse"
    max_item_size: int = 1024 * 1024
    instrumentation: tuple[str, ...] = ()
    instrumentation_name: str = "default"
    prometheus_registry: Any = None
    tracer_provider: Any = None
    trace_keys: bool = False
    gutter: tuple[str, ...] = ()
    gutter_ttl: int = DEFAULT_GUTTER_TTL
    replicate: Mapping[str, int] = field(default_factory=dict)
    replicate_scope: str = ""
    migrate_from: MigrationSource | None = None
    client_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "instrumentation", check_installed(self.instrumentation))
        if not isinstance(self.instrumentation_name, str) or not self.instrumentation_name:
            raise ConfigurationError(
                "option 'instrumentation_name' must be a non-empty string, "
                f"not {self.instrumentation_name!r}",
                option="instrumentation_name",
            )
        if not isinstance(self.trace_keys, bool):
            raise ConfigurationError(
                f"option 'trace_keys' must be True or False, not {self.trace_keys!r}",
                option="trace_keys",
            )
        _check_choice("ketama", self.ketama, VARIANTS)
        _check_choice("failover", self.failover, FAILOVER_POLICIES)
        self._check_replication()
        _check_choice("protocol", self.protocol, PROTOCOLS)
        _check_number("retry_attempts", self.retry_attempts, integer=True, minimum=1)
        _check_number("retry_timeout", self.retry_timeout, minimum=0)
        _check_number("dead_timeout", self.dead_timeout, minimum=0)
        _check_number(
            "connect_timeout", self.connect_timeout, minimum=0, optional=True, strict=True
        )
        _check_number("timeout", self.timeout, minimum=0, optional=True, strict=True)
        _check_number("max_pool_size", self.max_pool_size, integer=True, minimum=1, optional=True)
        _check_number("pool_idle_timeout", self.pool_idle_timeout, minimum=0)
        if not isinstance(self.raise_errors, bool):
            raise ConfigurationError(
                f"option 'raise_errors' must be True or False, not {self.raise_errors!r}",
                option="raise_errors",
            )
        _check_choice("on_outage", self.on_outage, ON_OUTAGE)
        object.__setattr__(self, "migrate_from", check_migrate_from(self.migrate_from, self.ketama))
        _check_choice("long_keys", self.long_keys, LONG_KEYS)
        _check_choice("large_values", self.large_values, LARGE_VALUES)
        _check_number("max_item_size", self.max_item_size, integer=True, minimum=1024)
        serde = SerdeOptions(
            self.serializer,
            self.signed,
            self.signing_key,
            self.signing_keys,
            compressor=self.compressor,
            compress_min_len=self.compress_min_len,
        )
        for name in SerdeOptions.NAMES:  # normalised: signed resolved, keys as bytes
            object.__setattr__(self, name, getattr(serde, name))
        reserved = sorted(_RESERVED_CLIENT_OPTIONS & set(self.client_options))
        if reserved:
            raise ConfigurationError(
                f"option {reserved[0]!r} is managed by django-mcpatterns and cannot be set",
                option=reserved[0],
            )
        # A misspelt option, or a pymemcache Client argument that has no meaning
        # without pymemcache's client: say so now, with the valid names.
        unknown = sorted(set(self.client_options) - CLIENT_OPTIONS)
        if unknown:
            ours = [f.name for f in dataclasses.fields(self) if f.name != "client_options"]
            raise ConfigurationError(
                f"unknown option {unknown[0]!r}; valid options: "
                + ", ".join(repr(o) for o in ours)
                + "; and socket options: "
                + ", ".join(repr(o) for o in sorted(CLIENT_OPTIONS)),
                option=unknown[0],
            )
        # Freeze the pass-through mapping so the options stay hashable and shareable.
        object.__setattr__(self, "client_options", _FrozenMapping(self.client_options))

    def _check_replication(self) -> None:
        """Validate (and freeze) ``replicate``, ``gutter`` and ``gutter_ttl``."""
        object.__setattr__(self, "replicate", _FrozenMapping(check_replicate(self.replicate)))
        if not isinstance(self.replicate_scope, str):
            raise ConfigurationError(
                f"option 'replicate_scope' must be a regular expression (str), "
                f"not {self.replicate_scope!r}",
                option="replicate_scope",
            )
        try:
            re.compile(self.replicate_scope)
        except re.error as exc:
            raise ConfigurationError(
                f"option 'replicate_scope' is not a regular expression: {exc}",
                option="replicate_scope",
            ) from exc
        gutter: Any = self.gutter
        if isinstance(gutter, str):
            gutter = tuple(g for g in re.split(r"[;,\s]+", gutter) if g)
        if not isinstance(gutter, list | tuple) or not all(isinstance(g, str) for g in gutter):
            raise ConfigurationError(
                f"option 'gutter' must be a list of server specs, not {self.gutter!r}",
                option="gutter",
            )
        object.__setattr__(self, "gutter", tuple(gutter))
        _check_number("gutter_ttl", self.gutter_ttl, integer=True, minimum=0, strict=True)
        if self.failover == "gutter" and not self.gutter:
            raise ConfigurationError(
                "failover='gutter' needs OPTIONS['gutter']: the list of gutter servers",
                option="gutter",
            )
        if self.gutter and self.failover != "gutter":
            raise ConfigurationError(
                f"option 'gutter' is used only with failover='gutter', not {self.failover!r}",
                option="gutter",
            )

    @property
    def serde_options(self) -> SerdeOptions:
        """The serialisation options, for :meth:`SerdeOptions.build`."""
        return SerdeOptions(
            self.serializer,
            self.signed,
            signing_keys=self.signing_keys,
            compressor=self.compressor,
            compress_min_len=self.compress_min_len,
        )

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> ClusterOptions:
        """Split ``options`` into ours and the socket options, and validate both."""
        ours = {f.name for f in dataclasses.fields(cls)} - {"client_options"}
        if not isinstance(options, Mapping | None):
            raise ConfigurationError(
                f"OPTIONS must be a mapping, not {type(options).__name__}", option="OPTIONS"
            )
        given = dict(options or {})
        client = given.pop("client_options", None) or {}
        if not isinstance(client, Mapping):
            raise ConfigurationError(
                f"option 'client_options' must be a mapping, not {client!r}",
                option="client_options",
            )
        client = dict(client)
        kwargs = {k: given.pop(k) for k in list(given) if k in ours}
        client.update(given)
        return cls(**kwargs, client_options=client)


class _FrozenMapping(dict[str, Any]):
    """A dict that hashes by content and refuses changes."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self.items())))

    def _readonly(self, *args: object, **kwargs: object) -> None:
        raise TypeError("cluster options are read-only")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _readonly  # type: ignore[assignment]


def _hashable(value: object) -> object:
    try:
        hash(value)
    except TypeError:
        return id(value)
    return value


def _check_choice(option: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigurationError(
            f"invalid value {value!r} for option {option!r}; valid choices: "
            + ", ".join(repr(c) for c in choices),
            option=option,
            choices=choices,
        )


def _check_number(
    option: str,
    value: object,
    *,
    integer: bool = False,
    minimum: float = 0,
    optional: bool = False,
    strict: bool = False,
) -> None:
    if value is None and optional:
        return
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool)
    if ok:
        ok = value > minimum if strict else value >= minimum  # type: ignore[operator]
    if not ok:
        what = "an integer" if integer else "a number"
        bound = f"> {minimum}" if strict else f">= {minimum}"
        none = " or None" if optional else ""
        raise ConfigurationError(
            f"option {option!r} must be {what} {bound}{none}, not {value!r}", option=option
        )
