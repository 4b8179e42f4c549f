"""Placeholder: the sets methods on cache objects (being written)."""


class SetsMixin:
    pass
