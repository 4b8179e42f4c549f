"""System checks for caches served by django-mcpatterns (``manage.py check``, ``runserver``).

Errors are what the backend raises, found at start-up: each comes from building
the backend (and so the cluster's ring) from the ``CACHES`` entry exactly as
Django will, so its message is word for word the ``ImproperlyConfigured`` the
backend raises.  (Django builds every cache while checking, for its own
``caches.W003``, so an entry the backend refuses stops ``manage.py check`` with
that very exception; these checks say the same, with an id and a hint, when
called on their own.)  Warnings are
configurations that work but do something you probably did not mean; silence
one with ``SILENCED_SYSTEM_CHECKS = ["mcpatterns.W005"]``.

* ``mcpatterns.E001`` unknown ``OPTIONS["ketama"]`` variant
* ``mcpatterns.E002`` malformed ``LOCATION`` (a server that does not parse, or none)
* ``mcpatterns.E003`` a server listed twice (same address, or the same ketama server)
* ``mcpatterns.E004`` twemproxy server names with a non-twemproxy variant
* ``mcpatterns.E005`` an invalid or unknown option
* ``mcpatterns.E006`` ``OPTIONS["instrumentation"]`` names an unknown instrumentation, or one
  whose package is not installed
* ``mcpatterns.W001`` server weights that the variant's peers apply differently
* ``mcpatterns.W002`` ``failover="remap"`` with a single server
* ``mcpatterns.W003`` ``dead_timeout`` shorter than ``retry_timeout``
* ``mcpatterns.W004`` ``timeout`` or ``connect_timeout`` of ``None``
* ``mcpatterns.W005`` unsigned pickled values on servers beyond loopback
* ``mcpatterns.W006`` a backend of ours in ``CACHES`` without ``django_mcpatterns`` installed
* ``mcpatterns.W007`` the status page needs ``django.contrib.auth``, which is missing
* ``mcpatterns.W008`` ``OPTIONS["replicate"]`` asks for more copies than there are servers
* ``mcpatterns.W009`` a gutter server (``OPTIONS["gutter"]``) is also in ``LOCATION``

Checks registered here run once this module is imported: ``AppConfig.ready``
does it, and so does importing the status view.  Nothing of a project that does
not install the app is imported before Django runs its checks, so W006 fires
only when something imported this module earlier (see ``docs/operations.md``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .core.exceptions import ConfigurationError
from .core.ketama import VARIANTS
from .core.options import ClusterOptions
from .core.servers import Server, parse_server, parse_servers
from .permissions import PermissionView, is_staff

APP = "django_mcpatterns"
TWEMPROXY_VARIANTS = tuple(v for v in VARIANTS if v.startswith("twemproxy"))
DOCS = "see docs/configuration.md"

HINTS = {
    "E001": "Set OPTIONS['ketama'] to the ketama your other clients use; " + DOCS + ".",
    "E002": "Write each server as 'host:port' or 'host:port:weight', in a list or in one "
    "string separated by ';' or ','.",
    "E003": "List each memcached server once, spelt as your other clients spell it.",
    "E004": "Server names only change the twemproxy rings: set OPTIONS['ketama'] to "
    + " or ".join(repr(v) for v in TWEMPROXY_VARIANTS)
    + ", or drop the names.",
    "E005": "See docs/configuration.md for every option and its valid values.",
    "E006": "Install the extra: pip install 'django-mcpatterns[prometheus]' or "
    "'django-mcpatterns[opentelemetry]'; or drop the name (see docs/operations.md).",
}

# Variants whose peers do not simply weigh servers as LOCATION says (ketama-spec.md).
WEIGHT_CAVEATS = {
    "libmemcached-ketama": (
        "a server weight other than 1 switches the 'libmemcached-ketama' ring to "
        "libmemcached's weighted MD5 points while keys keep the one-at-a-time hash "
        "(pylibmc with {'ketama': True} does the same): giving any server a weight "
        "moves almost every key",
        "Keep the weights only if your pylibmc/PHP peers use the same ones; to weigh "
        "servers, prefer OPTIONS['ketama'] = 'libmemcached' (KETAMA_WEIGHTED).",
    ),
    "spymemcached": (
        "spymemcached weighs servers only when its KetamaConnectionFactory is given a "
        "weight map; with the default factory, Java clients ignore these weights and "
        "route keys to other servers",
        "Give the Java clients the same weights, or drop the weights from LOCATION.",
    ),
}


@checks.register(checks.Tags.caches)
def check_caches(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
    """Check every ``CACHES`` entry served by one of our backends."""
    messages: list[Any] = []
    for alias, entry in settings.CACHES.items():
        backend = _our_backend(entry)
        if backend is not None:
            messages.extend(_check_cache(alias, backend, entry))
    return messages


@checks.register(checks.Tags.caches)
def check_installed(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
    """W006: our backend without the app, whose tags, commands and templates it provides."""
    if apps.is_installed(APP):
        return []
    return [
        checks.Warning(
            f"CACHES[{alias!r}] uses a django-mcpatterns backend but {APP!r} is not in "
            "INSTALLED_APPS.",
            hint=f"Add {APP!r} to INSTALLED_APPS: the {{% load mcpatterns %}} template tags, "
            "the mcpatterns_* management commands, the status page's template, the "
            "pattern counters and these checks are found only in an installed app.",
            obj=f"CACHES[{alias!r}]",
            id="mcpatterns.W006",
        )
        for alias, entry in settings.CACHES.items()
        if _our_backend(entry) is not None
    ]


@checks.register(checks.Tags.urls)
def check_status_page(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
    """W007: a status page that requires staff users where there are none to log in."""
    missing = [
        what
        for what, present in (
            ("'django.contrib.auth' in INSTALLED_APPS", apps.is_installed("django.contrib.auth")),
            (
                "AuthenticationMiddleware in MIDDLEWARE",
                "django.contrib.auth.middleware.AuthenticationMiddleware"
                in getattr(settings, "MIDDLEWARE", ()),
            ),
        )
        if not present
    ]
    if not missing:
        return []
    return [
        checks.Warning(
            f"The status page at {route!r} lets in staff users only, but "
            + " and ".join(missing)
            + " is missing: every request gets 403.",
            hint="Install django.contrib.auth (with its middleware), or pass "
            "StatusView.as_view(permission=...) a check that needs no users.",
            obj=route,
            id="mcpatterns.W007",
        )
        for route, view in _routes()
        if getattr(view, "view_class", None) is not None
        and issubclass(view.view_class, PermissionView)
        and view.view_initkwargs.get("permission", view.view_class.permission) is is_staff
    ]


# -- one cache -------------------------------------------------------------------


def _our_backend(entry: Mapping[str, Any]) -> type | None:
    """The entry's backend class when it is (a subclass of) one of ours."""
    # Imported here: the backend may import this module to register the checks.
    from .backend import KetamaMemcacheCache, LocMemPatternsCache

    try:
        backend = import_string(entry.get("BACKEND", ""))
    except ImportError:
        return None  # Django reports an unknown backend itself
    ours = isinstance(backend, type) and issubclass(
        backend, KetamaMemcacheCache | LocMemPatternsCache
    )
    return backend if ours else None


def _check_cache(alias: str, backend: type, entry: Mapping[str, Any]) -> list[Any]:
    from .backend import KetamaMemcacheCache

    obj = f"CACHES[{alias!r}]"
    location = entry.get("LOCATION", "")
    params = {k: v for k, v in entry.items() if k not in ("BACKEND", "LOCATION")}
    try:
        cache = backend(location, params)  # what django.core.cache.caches[alias] does
        if not isinstance(cache, KetamaMemcacheCache):
            cache.store  # noqa: B018 aliases sharing a LOCATION must agree on serde options
    except ImproperlyConfigured as exc:
        code = (
            _error_code(exc.__cause__, location, params.get("OPTIONS") or {})
            if issubclass(backend, KetamaMemcacheCache)
            else "E005"  # the embedded store has options only
        )
        return [checks.Error(str(exc), hint=HINTS[code], obj=obj, id=f"mcpatterns.{code}")]
    if not isinstance(cache, KetamaMemcacheCache):
        return []
    return list(_cluster_warnings(obj, cache.store.servers, cache.store.options))


def _error_code(cause: BaseException | None, location: object, options: Any) -> str:
    option = getattr(cause, "option", None)
    if option == "ketama":
        return "E001"
    if option == "LOCATION":
        return _location_code(location, options)
    if option == "instrumentation":
        return "E006"
    return "E005"


def _location_code(location: object, options: Any) -> str:
    """E002 for a server that does not parse, else what the ring refused (the
    options were accepted): E004 for server names on a variant without them,
    E003 for a server listed twice."""
    try:
        servers = parse_servers(location)  # type: ignore[arg-type]
    except ConfigurationError:
        return "E003" if _listed_twice(location) else "E002"
    variant = options.get("ketama", ClusterOptions.ketama)
    named = any(s.name for s in servers) and variant not in TWEMPROXY_VARIANTS
    return "E004" if named else "E003"


def _listed_twice(location: object) -> bool:
    """Whether every server parses but one is listed twice (what else parse_servers refuses)."""
    specs: Iterable[object] = (
        re.split("[;,]", location) if isinstance(location, str) else location or ()  # type: ignore[assignment]
    )
    nodes = []
    for spec in specs:
        if isinstance(spec, str) and not spec.strip():
            continue
        try:
            nodes.append(parse_server(spec).node)  # type: ignore[arg-type]
        except ConfigurationError:
            return False
    return len(set(nodes)) < len(nodes)


def _cluster_warnings(
    obj: str, servers: Sequence[Server], options: ClusterOptions
) -> Iterator[Any]:
    weighted = [s.node for s in servers if s.weight != 1]
    if weighted and options.ketama in WEIGHT_CAVEATS:
        message, hint = WEIGHT_CAVEATS[options.ketama]
        yield checks.Warning(
            f"{_capitalised(message)} (weighted: {_listing(weighted)}).",
            hint=hint,
            obj=obj,
            id="mcpatterns.W001",
        )
    if options.failover == "remap" and len(servers) == 1:
        yield checks.Warning(
            "failover='remap' has no other server to send a dead server's keys to: with a "
            "single server it behaves as 'miss'.",
            hint="Add servers, or set failover='miss'.",
            obj=obj,
            id="mcpatterns.W002",
        )
    if options.dead_timeout < options.retry_timeout:
        yield checks.Warning(
            f"dead_timeout ({options.dead_timeout:g} s) is shorter than retry_timeout "
            f"({options.retry_timeout:g} s): a server marked dead is tried again sooner than "
            "one that failed once.",
            hint="Make dead_timeout at least retry_timeout (the defaults are 30 and 1).",
            obj=obj,
            id="mcpatterns.W003",
        )
    blocking = [name for name in ("connect_timeout", "timeout") if getattr(options, name) is None]
    if blocking:
        yield checks.Warning(
            f"{' and '.join(blocking)} {'is' if len(blocking) == 1 else 'are'} None: a server "
            "that hangs holds every request that reaches it for ever, and failover never "
            "learns that it is down.",
            hint="Give a timeout in seconds (the default is 1.0).",
            obj=obj,
            id="mcpatterns.W004",
        )
    yield from _replication_warnings(obj, servers, options)
    # With the pickle serializer and no signing, values other than str, bytes
    # and int are unpickled as found, running code chosen by whoever wrote them.
    remote = [s.node for s in servers if not _is_loopback(s)]
    if remote and options.serde_options.executes_code_on_read:
        yield checks.Warning(
            f"Values are pickled and {_listing(remote)} {'is' if len(remote) == 1 else 'are'} "
            "beyond loopback: anyone who can write to memcached can run code in this process "
            "when it reads a value.",
            hint="Sign values (OPTIONS['signed'] = True: a key derived from SECRET_KEY) or "
            "use a serializer that cannot run code (OPTIONS['serializer'] = "
            "'django_mcpatterns.core.serializers.JSONSerializer'); or keep memcached on a "
            "network only your application servers reach (firewall it, disable UDP, use TLS "
            "through OPTIONS['tls_context']) and silence this warning with "
            "SILENCED_SYSTEM_CHECKS.  See docs/security.md.",
            obj=obj,
            id="mcpatterns.W005",
        )


def _replication_warnings(
    obj: str, servers: Sequence[Server], options: ClusterOptions
) -> Iterator[Any]:
    too_many = {p: n for p, n in options.replicate.items() if n > len(servers)}
    if too_many:
        listed = ", ".join(f"{p!r}: {n}" for p, n in too_many.items())
        yield checks.Warning(
            f"OPTIONS['replicate'] asks for more copies than there are servers ({listed}; "
            f"{len(servers)} in LOCATION): those keys get one copy per server, no more.",
            hint="Lower the number of copies to at most the number of servers, or add servers.",
            obj=obj,
            id="mcpatterns.W008",
        )
    main = {s.node for s in servers}
    shared = [g for g in (parse_server(spec).node for spec in options.gutter) if g in main]
    if shared:
        yield checks.Warning(
            f"The gutter pool shares {_listing(shared)} with LOCATION: a dead server's keys "
            "would land, with short TTLs, on a server that also serves its own keys, and a "
            "dead gutter server would be dead twice.",
            hint="Give OPTIONS['gutter'] spare servers of its own (a small pool: Facebook's is "
            "about 1% of the cluster).",
            obj=obj,
            id="mcpatterns.W009",
        )


def _is_loopback(server: Server) -> bool:
    """Unix sockets, ``localhost`` and loopback addresses; host names are never resolved."""
    if server.is_unix or server.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(server.host).is_loopback
    except ValueError:
        return False


def _listing(nodes: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(nodes[:most])
    return shown if len(nodes) <= most else f"{shown} and {len(nodes) - most} more"


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _routes() -> Iterator[tuple[str, Any]]:
    """``(route, view)`` of every URL pattern of ``ROOT_URLCONF``; none when it does not load."""
    from django.urls import URLPattern, URLResolver, get_resolver

    try:
        patterns = get_resolver().url_patterns
    except Exception:  # Django's own URL checks report a broken URLconf
        return

    def walk(entries: Iterable[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for entry in entries:
            if isinstance(entry, URLResolver):
                yield from walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                yield "/" + prefix + str(entry.pattern), entry.callback

    yield from walk(patterns, "")
