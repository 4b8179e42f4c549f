"""Flask's command line: ``flask mcpatterns-warm``, the warm-up of a new ring.

::

    from django_mcpatterns.flask import warm_command
    app.cli.add_command(warm_command)

    $ flask mcpatterns-warm [--from HOST:PORT,...] [--rate N] [--json]

The same copier and output as Django's ``manage.py mcpatterns_warm``
(:mod:`django_mcpatterns.warming`), on the app's first
:class:`~django_mcpatterns.flask.KetamaMemcachedCache` (``--cache`` picks
another by its ``CACHE_KEY_PREFIX``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext

from ..binding import ClusterBinding
from ..core.exceptions import ConfigurationError, NodeUnavailableError
from ..core.migrate.warm import WarmError
from ..warming import Bar, old_ring, stage_warning, summary_rows, warmer
from .backend import KetamaMemcachedCache

__all__ = ["warm_command"]


@click.command("mcpatterns-warm")
@click.option("--from", "servers", metavar="HOST:PORT,...", help="The old ring's servers.")
@click.option("--rate", type=float, metavar="N", help="At most N keys a second.")
@click.option("--cache", "prefix", metavar="PREFIX", help="The cache with this key prefix.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@with_appcontext
def warm_command(
    servers: str | None, rate: float | None, prefix: str | None, as_json: bool
) -> None:
    """Copy the plain items of the old ring that now belong to another server."""
    binding = _binding(prefix)
    if rate is not None and rate <= 0:
        raise click.UsageError(f"--rate must be a positive number of keys a second, not {rate}")
    try:
        old = old_ring(binding, servers)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    warning = stage_warning(binding)
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)
    bar = None if as_json else Bar(_write, sys.stdout.isatty())
    try:
        stats = warmer(binding, old, rate, bar).run()
    except (WarmError, NodeUnavailableError, OSError) as exc:
        raise click.ClickException(f"the warm-up stopped: {exc}") from exc
    finally:
        if bar is not None:
            bar.close()
    nodes = [server.node for server in old.servers]
    if as_json:
        click.echo(json.dumps({"from": nodes, **stats.as_dict()}, indent=2))
        return
    click.echo(f"Warmed from {', '.join(nodes)}")
    rows = summary_rows(stats)
    width = max(len(name) for name, _ in rows)
    for name, count in rows:
        click.echo(f"{name.ljust(width)}  {count}")


def _write(text: str) -> None:
    click.echo(text, nl=False)


def _binding(prefix: str | None) -> ClusterBinding:
    backends: dict[Any, Any] = current_app.extensions.get("cache", {})
    ours = [b for b in backends.values() if isinstance(b, KetamaMemcachedCache)]
    if prefix is not None:
        ours = [b for b in ours if b.key_prefix == prefix]
    if not ours:
        raise click.UsageError(
            "no Flask-Caching cache of this app uses django_mcpatterns.flask.KetamaMemcachedCache"
            + (f" with CACHE_KEY_PREFIX {prefix!r}" if prefix is not None else "")
        )
    binding: ClusterBinding = ours[0].binding
    return binding
