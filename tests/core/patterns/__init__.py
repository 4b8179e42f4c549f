"""The pattern tests written once in asyncio, with their generated sync form."""
