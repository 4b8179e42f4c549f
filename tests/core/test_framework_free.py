"""The core must import and work without Django or Flask (style.md, habit 1)."""

import subprocess
import sys
import textwrap


def test_core_imports_without_django_or_flask():
    # Run in a fresh interpreter where importing a framework fails, even though
    # they are installed here: any import of them from the core is then an error.
    code = textwrap.dedent(
        """
        import importlib, importlib.abc, pkgutil, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"django", "flask", "flask_caching", "werkzeug"}:
                    raise ImportError(f"core imported {name}")
                return None

        sys.meta_path.insert(0, Block())
        import django_mcpatterns.core as core
        for info in pkgutil.walk_packages(core.__path__, "django_mcpatterns.core."):
            importlib.import_module(info.name)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
