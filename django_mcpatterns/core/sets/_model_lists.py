"""Lists as read: the pure part of the append-based lists (see :mod:`django_mcpatterns.core.sets`).

Both forms of the algorithm (``_async_lists.py`` and the generated
``_sync_lists.py``) read a list into a :class:`ListView` and rewrite it
with :func:`carry_list` carrying racing writes over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store import CasToken
from ._model_layout import Header, Member, Removal, list_header_offset

__all__ = ["ListView", "carry_list"]


def carry_list(old: bytes, current: bytes, new: bytes) -> bytes | None:
    """Lists: removals prepended since the read stay in front, pushes stay behind."""
    shift = list_header_offset(current) - list_header_offset(old)
    if shift < 0 or current[shift : shift + len(old)] != old:
        return None
    return current[:shift] + new + current[shift + len(old) :]


@dataclass(slots=True)
class ListView:
    """A list as read: its removals and pushes, and what a rewrite needs."""

    data: bytes | None
    token: CasToken | None
    header: Header
    removals: list[Removal] = field(default_factory=list)
    pushes: list[tuple[int, Member]] = field(default_factory=list)
    ttl: int | None = None  # seconds left, as read with the item (None: not read)

    def items(self) -> list[tuple[int, Member]]:
        """The pushes that the removals leave, in order."""
        items = self.pushes
        for removal in sorted(self.removals, key=lambda r: r.stamp):
            hits = [
                i
                for i, (stamp, member) in enumerate(items)
                if stamp < removal.stamp and member == removal.member
            ]
            if removal.count > 0:
                hits = hits[: removal.count]
            elif removal.count < 0:
                hits = hits[removal.count :]
            drop = set(hits)
            items = [item for i, item in enumerate(items) if i not in drop]
        return items
