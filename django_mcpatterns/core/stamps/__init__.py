"""Stamps: cached results that carry the versions of what they depend on.

Framework-free half of the ORM cache (:mod:`django_mcpatterns.orm`): keys,
registries of dependency schemes, the one-round-trip read and the leased fill
(``_async.py``, with its generated sync form ``_sync.py``).  See
:mod:`._model` for the rules that make a read never stale.
"""

from ._async import (
    async_claim,
    async_fill,
    async_lease,
    async_prepare,
    async_read,
    async_read_leased,
    async_registries,
    async_release,
    async_renew,
    async_wait,
)
from ._model import (
    MAX_SCHEMES,
    Cached,
    Plan,
    Read,
    Registry,
    Scheme,
    conjunction_key,
    conjunctions,
    new_token,
    registry_key,
    table_key,
)
from ._sync import (
    claim,
    fill,
    lease,
    prepare,
    read,
    read_leased,
    registries,
    release,
    renew,
    wait,
)

__all__ = [
    "MAX_SCHEMES",
    "Cached",
    "Plan",
    "Read",
    "Registry",
    "Scheme",
    "async_claim",
    "async_fill",
    "async_lease",
    "async_prepare",
    "async_read",
    "async_read_leased",
    "async_registries",
    "async_release",
    "async_renew",
    "async_wait",
    "claim",
    "conjunction_key",
    "conjunctions",
    "fill",
    "lease",
    "new_token",
    "prepare",
    "read",
    "read_leased",
    "registries",
    "registry_key",
    "release",
    "renew",
    "table_key",
    "wait",
]
