"""A small Flask app using every pattern of django-mcpatterns through Flask-Caching.

Stampede-guarded and namespaced pages (``/report``, ``/items/<item>``, whose
edit form invalidates every cached variant at once), a memoized function, a
cached template fragment, a counter, a set, a list and a lock.

Run it (http://127.0.0.1:5000/)::

    .venv/bin/flask --app example_project/flask_app.py run

The cache is the embedded ``LocMemPatternsCache`` (no server needed) unless
``MEMCACHED_SERVERS`` names a cluster, e.g.
``MEMCACHED_SERVERS=127.0.0.1:11211,127.0.0.1:11212``: then it is the
ketama-routed ``KetamaMemcachedCache``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask, redirect, render_template_string, request, url_for
from flask_caching import Cache
from markupsafe import escape
from werkzeug.wrappers import Response

from django_mcpatterns.core.exceptions import LockTimeoutError
from django_mcpatterns.flask import stampede_guard

cache = Cache()

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>django-mcpatterns on Flask</title></head>
<body>
  <h1>{{ title }}</h1>
  <p>Cache: <strong id="backend">{{ backend }}</strong> ({{ servers }})</p>
  {{ body | safe }}
  {% cache 30, "nav" %}
  <nav>Pages (this menu is a cached template fragment, rendered at {{ now() }}):
    <a href="/">home</a> · <a href="/report">stampede-guarded report</a> ·
    <a href="/price/widget">memoized price</a> · <a href="/tags/widget">tags (a set)</a> ·
    <a href="/log">log (a list)</a> · <a href="/nightly-job">a lock</a> ·
    <a href="/items/widget">an item (a namespace)</a>
  </nav>
  {% endcache %}
</body></html>"""


def config_from_env() -> dict[str, Any]:
    """Flask-Caching settings: a memcached cluster if MEMCACHED_SERVERS is set, else embedded."""
    servers = os.environ.get("MEMCACHED_SERVERS", "").strip()
    if servers:
        return {
            "CACHE_TYPE": "django_mcpatterns.flask.KetamaMemcachedCache",
            "CACHE_MEMCACHED_SERVERS": servers,
            "CACHE_KEY_PREFIX": "flask_example_",
            "CACHE_OPTIONS": {"ketama": "libmemcached", "failover": "miss"},
        }
    return {
        "CACHE_TYPE": "django_mcpatterns.flask.LocMemPatternsCache",
        "CACHE_KEY_PREFIX": "flask_example_",
    }


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(CACHE_DEFAULT_TIMEOUT=60, **config_from_env())
    app.config.update(config or {})
    cache.init_app(app)
    app.jinja_env.globals["now"] = lambda: time.strftime("%H:%M:%S")
    register_views(app)
    return app


def page(title: str, body: str) -> str:
    backend = type(cache.cache).__name__
    servers = os.environ.get("MEMCACHED_SERVERS") or "in-process"
    return render_template_string(PAGE, title=title, body=body, backend=backend, servers=servers)


@cache.memoize(timeout=60)
def price(item: str) -> float:
    """Stand-in for a slow lookup, memoized by Flask-Caching on our backend."""
    time.sleep(0.05)
    return round(len(item) * 1.25, 2)


ITEM_FORM = """<p>Note: <b id='note'>{note}</b> (prices in <b id='currency'>{currency}</b>,
rendered at {rendered})</p>
<p><a href='?currency=eur'>in EUR</a> · <a href='?currency=usd'>in USD</a></p>
<form method='post' action='{edit}'><input name='note' value='{note}'>
<button>Save (invalidates every cached variant of this item's pages)</button></form>"""


def item_namespace(item: str) -> tuple[str, str]:
    """The namespace of an item's pages: invalidating it drops all of them, in every process."""
    return ("item", item)


def register_views(app: Flask) -> None:
    notes: dict[str, str] = {}  # stands in for the database of item notes

    @app.route("/")
    def home() -> str:
        views = cache.cache.inc("home:views")  # Flask-Caching's counter: atomic, starts at 0
        return page(
            "django-mcpatterns on Flask", f"<p>Home page views: <b id='views'>{views}</b></p>"
        )

    @app.route("/report")
    @stampede_guard(cache, timeout=30)
    def report() -> str:
        # After 30 s one request recomputes this while the others get the stale page.
        time.sleep(0.2)
        return page("Report", f"<p id='report'>Computed at {time.strftime('%H:%M:%S')}.</p>")

    @app.route("/price/<item>")
    def item_price(item: str) -> str:
        return page("Memoized price", f"<p>{escape(item)}: <b id='price'>{price(item)}</b></p>")

    @app.route("/tags/<item>")
    def tags(item: str) -> str:
        members = ", ".join(escape(m) for m in sorted(cache.cache.smembers(f"tags:{item}")))
        links = " ".join(
            f"<a href='{url_for('add_tag', item=item, tag=tag)}'>+{tag}</a>"
            for tag in ("new", "sale", "red")
        )
        return page(f"Tags of {escape(item)}", f"<p id='tags'>{members or 'none'}</p>{links}")

    @app.route("/tags/<item>/add/<tag>")
    def add_tag(item: str, tag: str) -> Response:
        cache.cache.sadd(f"tags:{item}", tag, timeout=0)  # 0: never expires (Flask-Caching)
        return redirect(url_for("tags", item=item))

    @app.route("/log")
    def log() -> str:
        cache.cache.rpush("visits", time.strftime("%H:%M:%S"))
        recent = cache.cache.lrange("visits", -5, -1)
        return page("Recent visits (a list)", f"<p id='log'>{', '.join(recent)}</p>")

    @app.route("/nightly-job")
    def nightly_job() -> str:
        try:
            with cache.cache.lock("nightly-job", timeout=10, blocking=False):
                time.sleep(0.1)  # the job: only one process runs it at a time
                outcome = "ran the job"
        except LockTimeoutError:
            outcome = "another process is running it"
        return page("A lock", f"<p id='job'>{outcome}</p>")

    @app.route("/items/<item>")
    @stampede_guard(cache, timeout=300, query_string=True, namespace=item_namespace)
    def item_page(item: str) -> str:
        # Cached per path and query (?currency=...) in the item's namespace.
        body = ITEM_FORM.format(
            note=escape(notes.get(item, "none")),
            currency=escape(request.args.get("currency", "usd")),
            rendered=time.strftime("%H:%M:%S"),
            edit=url_for("edit_item", item=item),
        )
        return page(f"Item {escape(item)}", body)

    @app.route("/items/<item>/edit", methods=["POST"])
    def edit_item(item: str) -> Response:
        notes[item] = request.form.get("note", "")
        item_page.invalidate_namespace(item=item)  # one incr: every variant is re-rendered
        return redirect(url_for("item_page", item=item))


app = create_app()
