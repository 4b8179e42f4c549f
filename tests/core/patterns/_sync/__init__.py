"""Generated from ../_async by scripts/generate_sync.py: do not edit the tests here."""
