"""Placeholder: the namespaces methods on cache objects (being written)."""


class NamespacesMixin:
    pass
