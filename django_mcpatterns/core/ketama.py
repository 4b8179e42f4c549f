"""Ketama consistent hashing (placeholder: being written)."""

VARIANTS = (
    "libmemcached",
    "libmemcached-ketama",
    "libketama",
    "twemproxy",
    "twemproxy-fnv1a_64",
    "spymemcached",
)
