"""The status page: the ketama ring, node health, memcached stats and pattern counters.

Add it to a project's URLconf, staff users only by default::

    from django.urls import include, path

    urlpatterns = [path("ops/cache/", include("django_mcpatterns.urls"))]  # "mcpatterns:status"

or as a view with its own options::

    from django_mcpatterns.views import StatusView, debug_or_staff

    path("status/", StatusView.as_view(permission=debug_or_staff, aliases=["default"]))

``permission`` is any ``request -> bool`` callable (refused requests get 403);
``aliases`` the caches to show (default: every cache served by our backends).
The page is rendered on the server, SVG charts included, with no JavaScript.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from . import checks  # noqa: F401  (registers the system checks, W006 included)
from .core.cluster import Cluster
from .counters import counters
from .decorators import patterns_cache
from .inspection import CacheStatus, arcs, cache_status, pattern_aliases
from .permissions import PermissionView
from .permissions import debug_or_staff as debug_or_staff  # the documented path
from .permissions import is_staff as is_staff

# Colours of the servers in the charts, in server order (then repeated).
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
# Where the page's "metrics documentation" link points: set StatusView.metrics_docs to the
# address of these docs where your team reads them (an absolute URL, or a path your site serves).
# None: no link (the package cannot know where its docs are served), the section is named instead.
METRICS_DOCS: str | None = None
METRICS = (
    "mcpatterns_commands_total",
    "mcpatterns_command_seconds",
    "mcpatterns_server_up",
    "mcpatterns_events_total",
    "mcpatterns_near_lookups_total",
)
RING_RADIUS = 80.0
BAR_WIDTH = 240.0


@dataclass
class ServerColumn:
    """One server's row in the ring legend, with its chart geometry."""

    node: str
    colour: str
    weight: int
    points: int
    share: float
    ideal: float
    bar: float  # bar length in SVG units
    ideal_x: float

    @property
    def share_pct(self) -> str:
        return f"{self.share * 100:.1f}%"

    @property
    def ideal_pct(self) -> str:
        return f"{self.ideal * 100:.1f}%"


@dataclass
class Section:
    """What the page shows for one cache alias."""

    alias: str
    status: CacheStatus | None = None
    error: str | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)
    legend: list[ServerColumn] = field(default_factory=list)
    instrumented: bool = False  # OPTIONS["instrumentation"] (or the debug toolbar) is on
    commands: list[dict[str, Any]] = field(default_factory=list)  # per server, this process
    events: dict[str, int] = field(default_factory=dict)  # per event, this process


def count_commands(section: Section, store: Cluster) -> None:
    """Fill in the section's per-server and per-event counts of this process."""
    counts = store.observer.counts() if store.observer is not None else None
    if counts is None:
        return
    section.instrumented = True
    rows, section.events = counts
    for node in store.servers:
        row = rows.get(node.node, {"commands": 0, "seconds": 0.0, "outcomes": {}})
        commands = row["commands"]
        section.commands.append(
            {
                "node": node.node,
                "commands": commands,
                "outcomes": ", ".join(f"{k} {v}" for k, v in sorted(row["outcomes"].items())),
                "mean_ms": row["seconds"] * 1000 / commands if commands else None,
            }
        )


def build_section(alias: str) -> Section:
    """Gather one cache's status and lay out its charts; an error becomes the section's text."""
    try:
        status = cache_status(alias)
    except Exception as exc:  # the page reports a broken cache, not a 500
        return Section(alias, error=f"{type(exc).__name__}: {exc}")
    section = Section(alias, status)
    store = patterns_cache(alias).store
    if not status.ring or not isinstance(store, Cluster):  # only a cluster has a ring
        return section
    count_commands(section, store)
    colours = {row.node: PALETTE[i % len(PALETTE)] for i, row in enumerate(status.ring)}
    section.legend = [
        ServerColumn(
            row.node,
            colours[row.node],
            row.weight,
            row.points,
            row.share,
            row.ideal,
            round(row.share * BAR_WIDTH, 2),
            round(row.ideal * BAR_WIDTH, 2),
        )
        for row in status.ring
    ]
    circumference = 2 * math.pi * RING_RADIUS
    section.segments = [
        {
            "node": arc.node,
            "colour": colours[arc.node],
            "dash": f"{arc.fraction * circumference:.3f} {circumference:.3f}",
            "offset": f"{-arc.start / 2**32 * circumference:.3f}",
        }
        for arc in arcs(store.ring)
    ]
    return section


def orm_rows() -> list[dict[str, Any]] | None:
    """The ORM cache's counts per model (this process); None when its app is not installed."""
    if not apps.is_installed("django_mcpatterns.orm"):
        return None
    from django_mcpatterns.orm import stats

    return [{"model": model, **counts} for model, counts in stats().items()]


@method_decorator(never_cache, name="dispatch")
class StatusView(PermissionView):
    """Render ``django_mcpatterns/status.html`` for the configured caches."""

    aliases: Sequence[str] | None = None
    template_name = "django_mcpatterns/status.html"
    metrics_docs: str | None = METRICS_DOCS

    def get(self, request: HttpRequest) -> HttpResponse:
        self.check_permission(request)
        aliases = list(self.aliases) if self.aliases is not None else pattern_aliases()
        context = {
            "sections": [build_section(alias) for alias in aliases],
            "orm": orm_rows(),
            "counters": counters.snapshot(),
            "metrics_docs": self.metrics_docs,
            "metrics": METRICS,
            "ring_radius": RING_RADIUS,
            "bar_width": BAR_WIDTH,
        }
        return TemplateResponse(request, self.template_name, context)
