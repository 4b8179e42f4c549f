# Generated from _async/__init__.py by scripts/generate_sync.py: do not edit.
"""The Django glue written once in asyncio; ``django_mcpatterns/_sync/`` is generated from it.

See ``docs/architecture.md``: edit here, then run ``python scripts/generate_sync.py``.
"""
