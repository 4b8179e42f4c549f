"""Value serialisation: pickle, JSON or msgpack, recorded in the item's flags, optionally signed.

A store turns every value into ``(bytes, flags)`` through a *serde* (pymemcache's
protocol).  The serde of our stores is a :class:`~.serde.ValueSerde`: the serializer named
by ``OPTIONS["serializer"]`` (a dotted path, one of this module's classes by
default), optional signing (:mod:`.signing`), and the read guard that decides
what happens to an item it will not decode (:mod:`.refusals`).  The soft-expiry
envelope (:mod:`.envelope`, flag bit 16) wraps it.

Flags (memcached's 32-bit client flags) say what the bytes are, so a reader never
guesses::

    value            flags                 data                    serializers
    bytes            0                     the bytes               all (raw: append/prepend work)
    str              FLAG_TEXT   (1 << 4)  UTF-8                   all
    int              FLAG_INTEGER (1 << 1) decimal ASCII           all (incr/decr work)
    anything else    FLAG_PICKLE (1 << 0)  pickle                  PickleSerializer (the default)
                     FLAG_JSON   (1 << 17) JSON (ASCII)            JSONSerializer
                     FLAG_MSGPACK (1 << 18) msgpack                MsgpackSerializer
    signed           + FLAG_SIGNED (1 << 20), data = HMAC-SHA256 (32 bytes) + data

Bits 0-4 are pymemcache's ``pickle_serde`` layout, so :class:`PickleSerializer`
reads and writes exactly what Django's ``PyMemcacheCache`` does.  Bits 17-20 are
clear of those of pymemcache (0-4), pylibmc (0-5), spymemcached (0-1, 8-15) and
the envelope (16).  A ``str`` that is not valid Unicode (lone surrogates) cannot
be UTF-8 text and goes through the serializer's own format.

What a write does with a value it cannot encode
    Raise :class:`~django_mcpatterns.core.exceptions.EncodingError` (e.g. a lambda with pickle, a
    ``set`` with JSON) before anything is sent.

The built-in serializers keep their documented path,
``django_mcpatterns.core.serializers`` (``OPTIONS["serializer"]`` names them by it).
"""

from __future__ import annotations

import functools
import json
import pickle
from typing import Any, ClassVar

from pymemcache.serde import FLAG_BYTES, FLAG_INTEGER, FLAG_LONG, FLAG_PICKLE, FLAG_TEXT

from ..exceptions import ConfigurationError, EncodingError
from .compression import FLAG_ZLIB, FLAG_ZSTD
from .envelope import FLAG_ENVELOPE
from .layout import FLAG_CHUNKED
from .plugins import import_subclass
from .refusals import Refusal
from .signing import FLAG_SIGNED

__all__ = [
    "BUILTIN_SERIALIZERS",
    "DEFAULT_SERIALIZER",
    "FLAG_JSON",
    "FLAG_MSGPACK",
    "JSONSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "UnpicklableValueError",
    "load_serializer",
]

FLAG_JSON = 1 << 17
FLAG_MSGPACK = 1 << 18

# The documented path of the built-in serializers (a one-line module re-exporting them).
PUBLIC_MODULE = "django_mcpatterns.core.serializers"
DEFAULT_SERIALIZER = f"{PUBLIC_MODULE}.PickleSerializer"


class UnpicklableValueError(EncodingError, pickle.PicklingError):
    """A value pickle cannot encode.

    Also a :class:`pickle.PicklingError`: Django's memcached backends and
    cachelib promise "a subclass of pickle.PickleError" for such values.
    """


class Serializer:
    """Turn values into ``(bytes, flags)`` and back; name a subclass in ``OPTIONS["serializer"]``.

    ``bytes``, ``str`` and ``int`` have one encoding for every serializer (see
    the module docstring); everything else goes through :meth:`dumps` under
    :attr:`flag`.  Subclasses set :attr:`flag` (a bit no other serializer
    uses) and implement :meth:`dumps`/:meth:`loads`; any exception they raise
    becomes an :class:`~django_mcpatterns.core.exceptions.EncodingError`.  Instantiated once per
    store, without arguments.
    """

    flag: ClassVar[int]
    #: Whether loading data can run code (pickle can): ``mcpatterns.W005`` warns about it.
    loads_can_run_code: ClassVar[bool] = False
    #: What :meth:`serialize` raises for a value :meth:`dumps` cannot encode.
    encode_error: ClassVar[type[EncodingError]] = EncodingError

    @property
    def name(self) -> str:
        return type(self).__name__

    def dumps(self, value: Any) -> bytes:
        raise NotImplementedError

    def loads(self, data: bytes) -> Any:
        raise NotImplementedError

    def serialize(self, key: Any, value: Any) -> tuple[bytes, int]:
        kind = type(value)  # exact types: subclasses keep their type through the format
        if kind is bytes:
            return value, FLAG_BYTES
        if kind is int:
            return b"%d" % value, FLAG_INTEGER
        if kind is str:
            try:
                return value.encode("utf-8"), FLAG_TEXT
            except UnicodeEncodeError:
                pass  # lone surrogates are not UTF-8 text; the format keeps them
        try:
            return self.dumps(value), self.flag
        except Exception as exc:
            raise self.encode_error(
                f"{self.name} cannot encode the value of {key!r}, a {kind.__name__}: {exc}"
            ) from exc

    def deserialize(self, key: Any, data: bytes, flags: int) -> Any:
        """Decode an item; raise :class:`~django_mcpatterns.core.exceptions.EncodingError` when it
        is not ours."""
        if flags == FLAG_BYTES:
            return data
        if flags not in (FLAG_TEXT, FLAG_INTEGER, FLAG_LONG, self.flag):
            raise Refusal("format", f"flags {flags:#x} are not a format of {self.name}")
        try:
            if flags == FLAG_TEXT:
                return data.decode("utf-8")
            if flags == self.flag:
                return self.loads(data)
            return int(data)  # FLAG_INTEGER; FLAG_LONG from python-memcache
        except Exception as exc:
            raise Refusal(
                "corrupt", f"{len(data)} bytes under flags {flags:#x} do not decode: {exc!r}"
            ) from exc

    def __repr__(self) -> str:
        return f"{self.name}()"


class PickleSerializer(Serializer):
    """pickle, in pymemcache's ``pickle_serde`` layout: what Django's ``PyMemcacheCache`` reads.

    Unpickling runs code chosen by whoever wrote the data: use it with servers
    only your application can write to, or with signing.
    """

    flag = FLAG_PICKLE
    loads_can_run_code = True
    encode_error = UnpicklableValueError
    protocol: ClassVar[int] = pickle.HIGHEST_PROTOCOL  # pymemcache's DEFAULT_PICKLE_VERSION

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class JSONSerializer(Serializer):
    """JSON: ``None``, bools, floats, lists, dicts with str keys (and str, int, bytes as above).

    Tuples come back as lists and dict keys as strings; other types (sets,
    datetimes, objects) raise :class:`~django_mcpatterns.core.exceptions.EncodingError`.  Override
    :meth:`dumps`/:meth:`loads` for more (e.g. Django's ``DjangoJSONEncoder``).
    """

    flag = FLAG_JSON

    def dumps(self, value: Any) -> bytes:
        # ensure_ascii: lone surrogates stay \\u escapes, so the output is always valid.
        return json.dumps(value, separators=(",", ":")).encode("ascii")

    def loads(self, data: bytes) -> Any:
        return json.loads(data.decode("utf-8"))


class MsgpackSerializer(Serializer):
    """msgpack (the ``msgpack`` extra): compact, and bytes stay bytes inside containers.

    Tuples come back as lists; other types raise
    :class:`~django_mcpatterns.core.exceptions.EncodingError`.
    """

    flag = FLAG_MSGPACK

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError as exc:
            raise ConfigurationError(
                f"serializer {type(self).__name__} needs the msgpack package: "
                "pip install 'django-mcpatterns[msgpack]'",
                option="serializer",
            ) from exc
        self._packb = functools.partial(msgpack.packb, use_bin_type=True)
        # strict_map_key=False: a dict with int keys must read back as it was written.
        self._unpackb = functools.partial(msgpack.unpackb, raw=False, strict_map_key=False)

    def dumps(self, value: Any) -> bytes:
        return self._packb(value)  # type: ignore[no-any-return]

    def loads(self, data: bytes) -> Any:
        return self._unpackb(data)


BUILTIN_SERIALIZERS = tuple(
    f"{PUBLIC_MODULE}.{cls.__name__}"
    for cls in (PickleSerializer, JSONSerializer, MsgpackSerializer)
)


# Bits with a meaning of their own: text, integers, longs, envelopes, signatures.
_RESERVED_FLAGS = frozenset(
    {
        FLAG_TEXT,
        FLAG_INTEGER,
        FLAG_LONG,
        FLAG_ENVELOPE,
        FLAG_SIGNED,
        FLAG_ZLIB,
        FLAG_ZSTD,
        FLAG_CHUNKED,
    }
)


def _own_bit(flag: object) -> bool:
    return (
        type(flag) is int
        and 0 < flag < 2**32
        and flag & (flag - 1) == 0  # a single bit: formats never combine
        and flag not in _RESERVED_FLAGS
    )


def load_serializer(path: str) -> Serializer:
    """Import the :class:`Serializer` subclass at dotted ``path`` and instantiate it."""
    choices = ", ".join(repr(p) for p in BUILTIN_SERIALIZERS)
    if not isinstance(path, str) or "." not in path:
        raise ConfigurationError(
            f"option 'serializer' must be a dotted path to a Serializer class, not {path!r}; "
            f"built in: {choices}",
            option="serializer",
            choices=BUILTIN_SERIALIZERS,
        )
    built_in = f"built in: {choices}"
    found = import_subclass(path, Serializer, "serializer", built_in, BUILTIN_SERIALIZERS)
    flag = getattr(found, "flag", None)
    if not _own_bit(flag):
        raise ConfigurationError(
            f"option 'serializer': {path!r} must set 'flag' to a bit of its own "
            f"(one of bits 0-31, not {sorted(f.bit_length() - 1 for f in _RESERVED_FLAGS)}), "
            f"not {flag!r}",
            option="serializer",
        )
    return found()
