"""Flask is an optional extra: the Django side never imports it, and the Flask side needs no Django.

Each check runs in a fresh interpreter whose import system refuses the other
framework, although both are installed here: an import of it anywhere on the
path under test is then an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # interpreters of their own

ROOT = Path(__file__).resolve().parents[2]

# Installs a finder refusing the packages added to ``BLOCKED``, and ``modules(package, skip)``
# to import every module of a package except the ``skip`` subpackage.
PRELUDE = """
import importlib, importlib.abc, pkgutil, sys

BLOCKED = set()

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"imported {name}")
        return None

sys.meta_path.insert(0, Block())

def modules(package, skip=None):
    root = importlib.import_module(package)
    for info in pkgutil.iter_modules(root.__path__, package + "."):
        if info.name == skip:
            continue
        importlib.import_module(info.name)
        if info.ispkg:
            modules(info.name, skip)
"""


def run(code: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environ.update(env)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=environ,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_django_parts_never_import_flask() -> None:
    out = run(
        """
        BLOCKED.update({"flask", "flask_caching", "werkzeug", "cachelib", "blinker"})
        import django_mcpatterns
        import django
        django.setup()
        modules("django_mcpatterns", skip="django_mcpatterns.flask")
        from django.core.cache import cache
        cache.set("key", "value")
        print(cache.get("key"))
        """,
        DJANGO_SETTINGS_MODULE="tests.django.settings",
    )
    assert out == "value"


def test_flask_part_never_imports_django() -> None:
    out = run(
        """
        BLOCKED.add("django")
        modules("django_mcpatterns.flask")
        from flask import Flask
        from flask_caching import Cache
        app = Flask("isolated")
        cache = Cache(app, config={"CACHE_TYPE": "django_mcpatterns.flask.LocMemPatternsCache"})
        with app.app_context():
            cache.set("key", "value")
            print(cache.get("key"), cache.cache.get_or_compute("computed", lambda: 42))
        """
    )
    assert out == "value 42"
