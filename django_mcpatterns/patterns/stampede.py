"""Placeholder: the stampede methods on cache objects (being written)."""


class StampedeMixin:
    pass
