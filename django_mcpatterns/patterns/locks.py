"""Placeholder: the locks methods on cache objects (being written)."""


class LocksMixin:
    pass
