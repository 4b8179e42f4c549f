"""The core and the pattern mixins import and work without Django or Flask (style.md, habit 1)."""

import subprocess
import sys
import textwrap

# Makes importing a framework fail, even though they are installed here.
BLOCK_FRAMEWORKS = """
import importlib, importlib.abc, pkgutil, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"django", "flask", "flask_caching", "werkzeug"}:
            raise ImportError(f"imported {name}")
        return None

sys.meta_path.insert(0, Block())
"""


def run_without_frameworks(code: str) -> str:
    """Run ``code`` in a fresh interpreter that cannot import a framework; return its output."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_FRAMEWORKS + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_core_imports_without_django_or_flask():
    # Any import of a framework from the core is then an error.
    out = run_without_frameworks(
        """
        import django_mcpatterns.core as core
        for info in pkgutil.walk_packages(core.__path__, "django_mcpatterns.core."):
            importlib.import_module(info.name)
        print("ok")
        """
    )
    assert out == "ok"


def test_the_sets_mixin_imports_no_framework() -> None:
    # The Flask backend reuses SetsMixin: it must load where Django cannot.
    out = run_without_frameworks(
        """
        from django_mcpatterns.patterns.sets import SetsMixin
        print(SetsMixin.__name__)
        """
    )
    assert out == "SetsMixin"


def test_the_binding_and_the_pattern_methods_import_no_framework() -> None:
    # Both frameworks' backends build on them (binding.py, patterns/).
    out = run_without_frameworks(
        """
        from django_mcpatterns.binding import Conventions, bind_embedded
        from django_mcpatterns.patterns import PatternMethods

        class Cache(PatternMethods):
            def __init__(self):
                self.binding = bind_embedded("", {}, Conventions())

            def _pattern_key(self, key, version=None):
                return key

            def _pattern_expire(self, timeout=None):
                return 0

        cache = Cache()
        print(cache.sadd("k", "m"), sorted(cache.smembers("k")))
        """
    )
    assert out == "1 ['m']"


def test_the_signal_table_imports_no_framework() -> None:
    # Both frameworks' signal modules read it (patterns/events.py).
    out = run_without_frameworks(
        """
        from django_mcpatterns.patterns.events import SIGNAL_NAMES
        print(sorted(SIGNAL_NAMES.values()))
        """
    )
    assert out == (
        "['compute_failed', 'lock_timed_out', 'lock_waited', 'recomputed', 'refresh_dropped', "
        "'stale_served', 'write_degraded']"
    )
