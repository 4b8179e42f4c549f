"""The sync pattern modules are what scripts/generate_sync.py makes from their async source."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("unasync")

ROOT = Path(__file__).resolve().parent.parent


def _script() -> object:
    spec = importlib.util.spec_from_file_location(
        "generate_sync", ROOT / "scripts" / "generate_sync.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_sync_modules_are_generated_from_the_async_source() -> None:
    script: object = _script()
    stale = script.stale()  # type: ignore[attr-defined]
    assert stale == [], f"regenerate with `python scripts/generate_sync.py`: {stale}"
