"""The patterns' algorithms, written once as asyncio code.

``core/_sync/`` holds their sync form, generated from these files by
``scripts/generate_sync.py`` (CI checks it is current): edit here, never there.
Only code that talks to a store lives here; what is pure (encodings, layouts,
options, events) lives in the plain ``core`` modules that both import.
"""
