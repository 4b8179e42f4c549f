"""Pattern tests written once in asyncio: the source of ../_sync (scripts/generate_sync.py)."""
