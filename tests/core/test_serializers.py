"""Serializers, signing and the refusal policy (core/values/), in-process and on memcached.

What users rely on: flags say what a value is and a reader never guesses;
pickle stays byte-compatible with Django's ``PyMemcacheCache``; an item a store
will not decode (another format, corrupt, unsigned or forged under signing) is
a logged, counted miss and is never unpickled; a value that cannot be encoded
raises before anything is stored.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.envelope import FLAG_ENVELOPE, Envelope
from django_mcpatterns.core.exceptions import ConfigurationError, EncodingError
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import (
    DEFAULT_SERIALIZER,
    FLAG_JSON,
    FLAG_MSGPACK,
    FLAG_SIGNED,
    REFUSED,
    JSONSerializer,
    PickleSerializer,
    SerdeOptions,
    Serializer,
    Signer,
    ValueRefused,
    ValueSerde,
    derive_signing_key,
    is_refused,
    load_serializer,
    with_derived_keys,
)
from django_mcpatterns.core.sets import AppendSets
from django_mcpatterns.core.stampede import Stampede
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, cluster_on, raw_client, require_module

KEY_A = b"k" * 32
KEY_B = b"rotated-" * 4
JSON_PATH = "django_mcpatterns.core.serializers.JSONSerializer"
MSGPACK_PATH = "django_mcpatterns.core.serializers.MsgpackSerializer"
MSGPACK_INSTALL = "pip install -e '.[msgpack]'"

# A pickle that runs code when loaded: what an attacker with write access plants.
EXPLOITS: list[str] = []


def _exploit(marker: str) -> str:
    EXPLOITS.append(marker)
    return marker


class Exploit:
    def __reduce__(self) -> Any:
        return (_exploit, ("code ran",))


FORGED_PICKLE = pickle.dumps(Exploit())


@pytest.fixture(autouse=True)
def no_exploit_ran() -> Iterator[None]:
    EXPLOITS.clear()
    yield
    assert EXPLOITS == [], "a refused pickle was loaded"


def msgpack_serializer() -> Serializer:
    require_module("msgpack", MSGPACK_INSTALL)
    return load_serializer(MSGPACK_PATH)


class Recorder:
    """``on_refused``: every event, in order."""

    def __init__(self) -> None:
        self.events: list[ValueRefused] = []

    def __call__(self, event: ValueRefused) -> None:
        self.events.append(event)

    @property
    def reasons(self) -> list[str]:
        return [event.reason for event in self.events]


# -- formats and flags --------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
pickle_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=4).map(tuple)
        | st.frozensets(st.integers() | st.text(), max_size=4)
        | st.dictionaries(st.integers() | st.text(max_size=5), inner)
    ),
    max_leaves=10,
)


@given(pickle_values)
def test_pickle_is_byte_for_byte_pymemcache_pickle_serde(value: Any) -> None:
    """What Django's PyMemcacheCache writes we read, and the other way round."""
    data, flags = PickleSerializer().serialize(b"k", value)
    theirs, their_flags = pickle_serde.serialize(b"k", value)
    assert (data, flags) == (theirs.encode() if isinstance(theirs, str) else theirs, their_flags)
    assert pickle_serde.deserialize(b"k", data, flags) == value
    assert PickleSerializer().deserialize(b"k", data, flags) == value


@given(json_values)
def test_json_round_trips_json_values(value: Any) -> None:
    serializer = JSONSerializer()
    assert serializer.deserialize(b"k", *serializer.serialize(b"k", value)) == value


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(msgpack_values)
def test_msgpack_round_trips_and_keeps_nested_bytes(value: Any) -> None:
    serializer = msgpack_serializer()
    assert serializer.deserialize(b"k", *serializer.serialize(b"k", value)) == value


def test_msgpack_refuses_ints_it_cannot_hold_inside_containers() -> None:
    serializer = msgpack_serializer()
    assert serializer.serialize(b"k", 2**70) == (b"%d" % 2**70, 1 << 1)  # top level: text
    with pytest.raises(EncodingError, match="out of range"):
        serializer.serialize(b"k", [2**70])


@pytest.mark.parametrize(
    ("path", "flag"),
    [(DEFAULT_SERIALIZER, 1), (JSON_PATH, FLAG_JSON), (MSGPACK_PATH, FLAG_MSGPACK)],
)
def test_every_serializer_flags_its_format_and_shares_bytes_text_and_ints(
    path: str, flag: int
) -> None:
    if path == MSGPACK_PATH:
        require_module("msgpack", MSGPACK_INSTALL)
    serializer = load_serializer(path)
    assert serializer.serialize(b"k", b"raw") == (b"raw", 0)  # append/prepend-able
    assert serializer.serialize(b"k", "tëxt") == ("tëxt".encode(), 1 << 4)
    assert serializer.serialize(b"k", -42) == (b"-42", 1 << 1)  # incr/decr-able
    assert serializer.serialize(b"k", [1, 2])[1] == flag
    assert serializer.serialize(b"k", True)[1] == flag  # bool is not an int counter
    # A str that is not valid Unicode is not UTF-8 text: the format carries it.
    if path != MSGPACK_PATH:
        data, flags = serializer.serialize(b"k", "\ud800")
        assert flags == flag
        assert serializer.deserialize(b"k", data, flags) == "\ud800"


def test_json_is_lossy_only_where_documented() -> None:
    serializer = JSONSerializer()
    assert serializer.deserialize(b"k", *serializer.serialize(b"k", (1, 2))) == [1, 2]
    assert serializer.deserialize(b"k", *serializer.serialize(b"k", {1: "a"})) == {"1": "a"}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (DEFAULT_SERIALIZER, lambda: None),
        (JSON_PATH, {1, 2}),
        (JSON_PATH, object()),
        (JSON_PATH, b"\x00" * 3 + b"x"),  # fine at top level (raw bytes)...
        (JSON_PATH, [b"nested bytes"]),  # ...but not inside JSON
        (MSGPACK_PATH, object()),
    ],
)
def test_a_value_the_format_cannot_encode_raises_encoding_error(path: str, value: Any) -> None:
    if path == MSGPACK_PATH:
        require_module("msgpack", MSGPACK_INSTALL)
    serializer = load_serializer(path)
    if type(value) is bytes:
        assert serializer.serialize(b"k", value) == (value, 0)
        return
    with pytest.raises(EncodingError, match=type(value).__name__):
        serializer.serialize(b"k", value)


def test_unpicklable_values_raise_a_pickle_error_too() -> None:
    """Django's and cachelib's contracts: "a subclass of pickle.PickleError"."""
    with pytest.raises(pickle.PickleError) as info:
        PickleSerializer().serialize(b"k", lambda: None)
    assert isinstance(info.value, EncodingError)
    with pytest.raises(EncodingError) as json_info:
        JSONSerializer().serialize(b"k", {1})
    assert not isinstance(json_info.value, pickle.PickleError)


def test_nothing_is_stored_when_one_value_cannot_be_encoded(clock: FakeClock) -> None:
    store = MemoryStore(serde=ValueSerde(JSONSerializer()), clock=clock)
    with pytest.raises(EncodingError):
        store.set_many({"a": 1, "b": {2}})
    assert store.get_many(["a", "b"]) == {}
    with pytest.raises(EncodingError):
        store.set("a", {3})
    assert store.get("a") is None


def test_nothing_is_sent_when_one_value_cannot_be_encoded(
    memcached_3: list[MemcachedServer],
) -> None:
    options = ClusterOptions(serializer=JSON_PATH)
    with cluster_on(memcached_3) as plain:
        cluster = Cluster(plain.servers, options)
        keys = [f"k{i}" for i in range(12)]  # on every server
        with pytest.raises(EncodingError):
            cluster.set_many({**dict.fromkeys(keys, 1), "bad": {1}})
        assert cluster.get_many(keys) == {}
        cluster.close()


# -- choosing a serializer ----------------------------------------------------------


class EnvelopeBitSerializer(JSONSerializer):
    flag = FLAG_ENVELOPE  # taken: it would read as a soft-expiry envelope


class TwoBitSerializer(JSONSerializer):
    flag = FLAG_JSON | FLAG_MSGPACK


class CompactJSONSerializer(JSONSerializer):
    """A serializer of one's own: a flag bit nobody else uses."""

    flag = 1 << 24  # (bit 21 marks chunk manifests, 19 zstd: core/values/layout.py, compression.py)


def test_a_serializer_of_ones_own_by_dotted_path(clock: FakeClock) -> None:
    options = ClusterOptions(serializer="tests.core.test_serializers.CompactJSONSerializer")
    serde = options.serde_options.build()
    assert serde.serialize(b"k", [1]) == (b"[1]", 1 << 24)
    store = MemoryStore(serde=serde, clock=clock)
    store.set("k", {"a": None})
    assert store.get("k") == {"a": None}


@pytest.mark.parametrize(
    ("path", "message"),
    [
        (42, "dotted path"),
        ("pickle", "dotted path"),
        ("no.such.module.Serializer", "cannot import"),
        ("django_mcpatterns.core.serializers.Nope", "cannot import"),
        ("django_mcpatterns.core.serializers.Signer", "not a subclass"),
        ("django_mcpatterns.core.serializers.Serializer", "flag"),
        ("tests.core.test_serializers.EnvelopeBitSerializer", "bit of its own"),
        ("tests.core.test_serializers.TwoBitSerializer", "bit of its own"),
    ],
)
def test_a_bad_serializer_path_is_a_configuration_error(path: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        ClusterOptions(serializer=path)
    assert info.value.option == "serializer"


def test_from_mapping_takes_the_serializer_and_signing_options() -> None:
    options = ClusterOptions.from_mapping({"serializer": JSON_PATH, "signing_key": KEY_A})
    assert options.serializer == JSON_PATH
    assert options.signed is True
    assert options.signing_keys == (KEY_A,)
    assert options.client_options == {}
    serde = options.serde_options.build()
    assert isinstance(serde.serializer, JSONSerializer)
    assert serde.signer is not None


def test_msgpack_without_the_package_says_how_to_install_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["msgpack"] = None  # as if not installed
        from django_mcpatterns.core.options import ClusterOptions
        from django_mcpatterns.core.exceptions import ConfigurationError
        try:
            ClusterOptions(serializer="django_mcpatterns.core.serializers.MsgpackSerializer")
        except ConfigurationError as exc:
            print(exc.option, exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.startswith("serializer ")
    assert "pip install 'django-mcpatterns[msgpack]'" in result.stdout


# -- signing options ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        ({"signed": True}, "signing_key", "SECRET_KEY"),
        ({"signed": "yes"}, "signed", "True or False"),
        ({"signed": False, "signing_key": KEY_A}, "signed", "drop one"),
        ({"signing_key": b"short"}, "signing_key", "at least 32 bytes"),
        ({"signing_keys": [KEY_A, "short"]}, "signing_keys", "at least 32 bytes"),
        ({"signing_keys": KEY_A}, "signing_keys", "a list"),
        ({"signing_key": KEY_A, "signing_keys": [KEY_B]}, "signing_keys", "not both"),
    ],
)
def test_bad_signing_options_name_the_option(
    options: dict[str, Any], option: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        ClusterOptions(**options)
    assert info.value.option == option


def test_keys_are_normalised_and_never_shown() -> None:
    text_key = "é" * 16  # 32 bytes of UTF-8
    options = ClusterOptions(signing_keys=[text_key, KEY_B])
    assert options.signing_keys == (text_key.encode(), KEY_B)
    assert options.signed is True
    assert text_key not in repr(options)
    assert "rotated" not in repr(options)
    assert "rotated" not in repr(options.serde_options)
    # strict() and the shared-cluster registry copy the options: still valid, still equal.
    assert ClusterOptions(signing_key=KEY_A) == ClusterOptions(signing_keys=[KEY_A])
    hash(options)


def test_derived_keys_come_from_the_secret_only_when_asked() -> None:
    calls: list[int] = []

    def secrets() -> list[str]:
        calls.append(1)
        return ["secret", "", "old secret"]

    assert with_derived_keys({"signed": False}, secrets) == {"signed": False}
    assert with_derived_keys({"signed": True, "signing_key": KEY_A}, secrets)["signing_key"]
    assert calls == []
    derived = with_derived_keys({"signed": True}, secrets)["signing_keys"]
    assert derived == [derive_signing_key("secret"), derive_signing_key("old secret")]
    assert len(derived[0]) == 32
    assert derived[0] != derive_signing_key(b"other")


# -- the refusal policy: a logged, counted miss --------------------------------------


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def json_store(clock: FakeClock, recorder: Recorder) -> MemoryStore:
    return MemoryStore(serde=ValueSerde(JSONSerializer(), on_refused=recorder), clock=clock)


def plant(store: MemoryStore, key: str, data: bytes, flags: int) -> None:
    """Write raw bytes and flags into the store, as another client would."""
    store.set(key, b"placeholder")
    item = store._items[key.encode()]
    store._items[key.encode()] = type(item)(data, flags, None, item.cas, item.size)


@pytest.mark.parametrize(
    ("data", "flags", "reason"),
    [
        (FORGED_PICKLE, 1, "format"),  # pickle under a JSON store: never unpickled
        (b"\x93\x01", FLAG_MSGPACK, "format"),  # another serializer
        (b"x", 1 << 3, "corrupt"),  # zlib's bit (pylibmc, pymemcache) on data that won't inflate
        (b"{}", FLAG_JSON | FLAG_ENVELOPE >> 1, "format"),  # flags that mix formats
        (b"{not json", FLAG_JSON, "corrupt"),
        (b"\xff\xfe", 1 << 4, "corrupt"),  # text that is not UTF-8
        (b"12x", 1 << 1, "corrupt"),  # an int that is not a number
        (b"{}" + b"x" * 40, FLAG_SIGNED | FLAG_JSON, "format"),  # signed, and we do not sign
    ],
)
def test_an_item_the_store_will_not_decode_is_a_logged_counted_miss(
    clock: FakeClock,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
    data: bytes,
    flags: int,
    reason: str,
) -> None:
    store = json_store(clock, recorder)
    store.set("other", {"kept": True})
    plant(store, "bad", data, flags)
    sentinel = object()
    reads: list[Callable[[], Any]] = [
        lambda: store.get("bad", sentinel) is sentinel,
        lambda: store.gets("bad") == (None, None),
        lambda: store.get_many(["bad", "other"]) == {"other": {"kept": True}},
        lambda: set(store.gets_many(["bad", "other"])) == {"other"},
    ]
    with caplog.at_level(logging.WARNING, "django_mcpatterns.serializers"):
        for read in reads:
            plant(store, "bad", data, flags)
            assert read()
            assert store._items[b"bad"].data == data  # left in place: maybe another client's
    assert recorder.reasons == [reason] * 4
    assert recorder.events[0] == ValueRefused(b"bad", reason, flags, recorder.events[0].detail)
    assert store.serde.inner.refusals() == {reason: 4}  # type: ignore[attr-defined]
    assert caplog.text.count("refused the cached value of b'bad'") == 4
    assert store.set("bad", [1])
    assert store.get("bad") == [1]


def test_a_corrupt_pickle_is_a_counted_miss_not_pymemcaches_silent_none(
    clock: FakeClock, recorder: Recorder
) -> None:
    assert pickle_serde.deserialize(b"k", b"\x80\x05garbage", 1) is None  # what we fix
    store = MemoryStore(serde=ValueSerde(on_refused=recorder), clock=clock)
    plant(store, "k", b"\x80\x05garbage", 1)
    assert store.get("k", "default") == "default"
    assert recorder.reasons == ["corrupt"]


def test_a_pickle_whose_class_is_gone_is_a_counted_miss(
    clock: FakeClock, recorder: Recorder
) -> None:
    store = MemoryStore(serde=ValueSerde(on_refused=recorder), clock=clock)
    data = pickle.dumps(Recorder()).replace(b"Recorder", b"Vanished")
    plant(store, "k", data, 1)
    assert store.get("k") is None
    assert recorder.reasons == ["corrupt"]
    assert "Vanished" in recorder.events[0].detail


def test_a_failing_on_refused_hook_is_logged_and_the_read_still_misses(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(event: ValueRefused) -> None:
        raise RuntimeError("hook bug")

    store = MemoryStore(serde=ValueSerde(on_refused=broken), clock=clock)
    plant(store, "k", b"garbage", 1)
    assert store.get("k", 7) == 7
    assert "on_refused handler failed" in caplog.text


def test_refused_inside_an_envelope_is_a_miss_and_get_or_compute_regenerates_it(
    clock: FakeClock, recorder: Recorder
) -> None:
    signed = ValueSerde(signing_keys=[KEY_A], on_refused=recorder)
    store = MemoryStore(serde=signed, clock=clock)
    stampede = Stampede(store, clock=clock)
    assert stampede.get_or_compute("page", lambda: {"v": 1}, 60) == {"v": 1}
    # Forge the envelope's inner value: a pickle, unsigned.
    item = store._items[b"page"]
    header = item.data[:25]
    plant(store, "page", header + FORGED_PICKLE, FLAG_ENVELOPE | 1)
    assert store.gets_envelope("page") == (None, None)
    assert stampede.get_or_compute("page", lambda: {"v": 2}, 60) == {"v": 2}
    # Each read of the forged item (get, get_or_compute's read and re-read) was refused.
    assert set(recorder.reasons) == {"unsigned"}
    assert store.get("page") == {"v": 2}


def test_the_refused_marker_never_leaks() -> None:
    assert not REFUSED
    assert is_refused(REFUSED)
    assert is_refused(Envelope(REFUSED))
    assert not is_refused(None)
    with pytest.raises(EncodingError):
        pickle.dumps(REFUSED)


# -- signing --------------------------------------------------------------------------


def signed_store(clock: FakeClock, recorder: Recorder, *keys: bytes) -> MemoryStore:
    serde = ValueSerde(signing_keys=keys or (KEY_A,), on_refused=recorder)
    return MemoryStore(serde=serde, clock=clock)


@given(pickle_values)
def test_signed_values_round_trip(value: Any) -> None:
    serde = ValueSerde(signing_keys=[KEY_A])
    data, flags = serde.serialize(b"key", value)
    assert serde.deserialize(b"key", data, flags) == value
    assert bool(flags & FLAG_SIGNED) == (type(value) not in (bytes, int))


def test_the_signature_binds_key_flags_and_data() -> None:
    signer = Signer([KEY_A])
    signed = signer.sign(b"key", FLAG_SIGNED | 1, b"payload")
    assert len(signed) == 32 + len(b"payload")
    assert signer.verify(b"key", FLAG_SIGNED | 1, signed) == b"payload"
    assert signer.verify("key", FLAG_SIGNED | 1, signed) == b"payload"  # str keys are UTF-8
    for key, flags, data in [
        (b"other", FLAG_SIGNED | 1, signed),  # copied to another key
        (b"key", FLAG_SIGNED | FLAG_JSON, signed),  # flags changed
        (b"key", FLAG_SIGNED | 1, signed[:-1] + b"X"),  # data changed
        (b"key", FLAG_SIGNED | 1, signed[:31]),  # truncated
    ]:
        with pytest.raises(EncodingError, match="signature"):
            signer.verify(key, flags, data)


def test_rotation_the_first_key_signs_every_key_verifies() -> None:
    old = ValueSerde(signing_keys=[KEY_A])
    rotated = ValueSerde(signing_keys=[KEY_B, KEY_A])
    data, flags = old.serialize(b"k", {"v": 1})
    assert rotated.deserialize(b"k", data, flags) == {"v": 1}
    new_data, new_flags = rotated.serialize(b"k", {"v": 1})
    assert new_data[:32] != data[:32]
    assert is_refused(old.deserialize(b"k", new_data, new_flags))


@pytest.mark.parametrize(
    ("data", "flags", "reason"),
    [
        (FORGED_PICKLE, 1, "unsigned"),
        (b"text", 1 << 4, "unsigned"),
        (b"[1]", FLAG_JSON, "unsigned"),
        (b"\x00" * 32 + FORGED_PICKLE, FLAG_SIGNED | 1, "signature"),
    ],
)
def test_signed_mode_refuses_what_it_did_not_sign_and_never_unpickles_it(
    clock: FakeClock, recorder: Recorder, data: bytes, flags: int, reason: str
) -> None:
    store = signed_store(clock, recorder)
    plant(store, "victim", data, flags)
    assert store.get("victim", "miss") == "miss"
    assert recorder.reasons == [reason]


def test_signed_mode_keeps_raw_bytes_and_ints_unsigned_for_append_and_incr(
    clock: FakeClock, recorder: Recorder
) -> None:
    store = signed_store(clock, recorder)
    store.set("counter", 41)
    assert store.incr("counter") == 42
    assert store.get("counter") == 42
    store.set("raw", b"abc")
    assert store.append("raw", b"def")
    assert store.get("raw") == b"abcdef"
    sets = AppendSets(store)
    sets.sadd("s", "a", b"b", 3)
    sets.srem("s", b"b")
    assert sets.smembers("s") == {"a", 3}
    # A text counter is signed: memcached refuses to increment it, as documented.
    store.set("text", "5")
    assert store.get("text") == "5"
    assert recorder.events == []


def test_a_value_signed_for_one_key_is_refused_under_another(
    clock: FakeClock, recorder: Recorder
) -> None:
    store = signed_store(clock, recorder)
    store.set("admin", {"role": "admin"})
    item = store._items[b"admin"]
    plant(store, "guest", item.data, item.flags)
    assert store.get("guest") is None
    assert recorder.reasons == ["signature"]


def test_a_serializer_mismatch_under_signing_is_format(
    clock: FakeClock, recorder: Recorder
) -> None:
    pickled = ValueSerde(signing_keys=[KEY_A])
    data, flags = pickled.serialize(b"k", [1])
    jsoned = ValueSerde(JSONSerializer(), signing_keys=[KEY_A], on_refused=recorder)
    assert is_refused(jsoned.deserialize(b"k", data, flags))
    assert recorder.reasons == ["format"]


# -- on a real server -------------------------------------------------------------------


@pytest.fixture
def server(memcached_1: list[MemcachedServer]) -> MemcachedServer:
    memcached_1[0].flush()
    return memcached_1[0]


def forge(server: MemcachedServer, key: str) -> None:
    """Write a code-running pickle with a raw client, flagged as pymemcache's pickle."""
    attacker = raw_client(server)
    attacker.set(key, FORGED_PICKLE, flags=1)
    attacker.close()


def signed_cluster(server: MemcachedServer, recorder: Callable[[ValueRefused], object]) -> Cluster:
    options = ClusterOptions(signing_key=KEY_A, timeout=2)
    return Cluster([server.spec], options, serde=options.serde_options.build(recorder))


def test_a_forged_pickle_written_with_a_raw_client_is_refused_never_unpickled(
    server: MemcachedServer, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's test: write access to memcached does not become code execution."""
    cluster = signed_cluster(server, recorder)
    cluster.set("session:1", {"user": 1})
    cluster.set("session:2", {"user": 2})
    forge(server, "session:1")
    # The forged item is really there, and a pickle reader would run it.
    plain = raw_client(server, serde=pickle_serde)
    assert plain.get("session:1") == "code ran"
    plain.close()
    EXPLOITS.clear()

    reads: list[Callable[[], Any]] = [
        lambda: cluster.get("session:1", "miss") == "miss",
        lambda: cluster.gets("session:1") == (None, None),
        lambda: cluster.get_many(["session:1", "session:2"]) == {"session:2": {"user": 2}},
        lambda: set(cluster.gets_many(["session:1", "session:2"])) == {"session:2"},
    ]
    for read in reads:
        forge(server, "session:1")
        assert read()
        assert raw_client(server).get("session:1") == FORGED_PICKLE  # refused, left in place
    assert recorder.reasons == ["unsigned"] * 4
    assert cluster.serde.inner.refusals() == {"unsigned": 4}
    assert "refused the cached value of b'session:1' (unsigned)" in caplog.text
    # The connection stayed in step, and a set replaces the forged item.
    assert cluster.set("session:1", {"user": 1})
    assert cluster.get("session:1") == {"user": 1}
    cluster.close()


def test_unsigned_pickle_on_a_real_server_corrupt_is_a_miss_and_the_stream_stays_in_step(
    server: MemcachedServer, recorder: Recorder
) -> None:
    cluster = Cluster([server.spec], serde=ValueSerde(on_refused=recorder))
    client = raw_client(server)
    client.set("good", b"fine", flags=1 << 4)  # text
    for _ in range(3):
        client.set("bad", b"\x80\x05not a pickle", flags=1)
        assert cluster.get("bad") is None
        client.set("bad", b"\x80\x05not a pickle", flags=1)
        assert cluster.get_many(["bad", "good"]) == {"good": "fine"}
    client.close()
    assert recorder.reasons == ["corrupt"] * 6
    cluster.close()


@pytest.mark.parametrize("path", [DEFAULT_SERIALIZER, JSON_PATH, MSGPACK_PATH])
def test_each_serializer_on_a_real_server_and_a_mismatched_reader_misses(
    server: MemcachedServer, recorder: Recorder, path: str
) -> None:
    if path == MSGPACK_PATH:
        require_module("msgpack", MSGPACK_INSTALL)
    writer = Cluster([server.spec], ClusterOptions(serializer=path))
    value = {"a": [1, 2.5, None, True], "b": "ü"}
    assert writer.set("v", value)
    assert writer.set("n", 5)
    assert writer.incr("n", 2) == 7
    assert writer.get("v") == value
    other = JSON_PATH if path != JSON_PATH else DEFAULT_SERIALIZER
    reader = Cluster([server.spec], serde=SerdeOptions(serializer=other).build(on_refused=recorder))
    assert reader.get("v", "miss") == "miss"
    assert reader.get("n") == 7  # ints are every serializer's
    assert recorder.reasons == ["format"]
    writer.close()
    reader.close()


# -- values other clients wrote: a counted miss, left in place -------------------------

# What PHP, Java and pylibmc clients write on a shared ring, as bytes and flags we refuse.
FOREIGN_VALUES = [
    pytest.param(b'a:1:{s:4:"name";s:3:"ann";}', 4, "corrupt", id="php-serialized"),
    pytest.param(b"\xac\xed\x00\x05t\x00\x03ann", 1, "corrupt", id="java-serialized"),
    # zlib's bit, as pylibmc sets it, on a stream cut short: compressed values read (below).
    pytest.param(b"x\x9c\xcbH\xcd\xc9", 1 << 3 | 1, "corrupt", id="zlib-truncated"),
    pytest.param(b"42", 3 << 8, "format", id="spymemcached-long"),
]


@pytest.mark.parametrize(("data", "flags", "reason"), FOREIGN_VALUES)
def test_a_value_another_client_wrote_is_a_counted_miss_and_stays_in_place(
    server: MemcachedServer, recorder: Recorder, data: bytes, flags: int, reason: str
) -> None:
    cluster = Cluster([server.spec], serde=ValueSerde(on_refused=recorder))
    php = raw_client(server)
    php.set("shared:1", data, flags=flags)
    cluster.set("ours", "fine")
    before = php.gets("shared:1")
    reads: list[Callable[[], Any]] = [
        lambda: cluster.get("shared:1", "miss") == "miss",
        lambda: cluster.gets("shared:1") == (None, None),
        lambda: cluster.get_many(["shared:1", "ours"]) == {"ours": "fine"},
        lambda: set(cluster.gets_many(["shared:1", "ours"])) == {"ours"},
    ]
    for read in reads:
        assert read()
        # Untouched: the same bytes, and the same cas token (nothing rewrote it).
        assert php.gets("shared:1") == before
    assert recorder.reasons == [reason] * 4
    assert cluster.serde.inner.refusals() == {reason: 4}
    # add() fills missing keys only: the other client's value stays; set() replaces it.
    assert cluster.add("shared:1", "ours") is False
    assert php.gets("shared:1") == before
    assert cluster.set("shared:1", "ours")
    assert cluster.get("shared:1") == "ours"
    php.close()
    cluster.close()


def test_a_value_pylibmc_compressed_reads_here_and_stays_readable_by_pylibmc(
    server: MemcachedServer, recorder: Recorder
) -> None:
    pylibmc = require_module("pylibmc", "apt-get install libmemcached-dev; pip install pylibmc")
    peer = pylibmc.Client([server.spec])
    value = {"name": "ann", "tags": ["x"] * 50}
    peer.set("shared:2", value, min_compress_len=1)  # zlib-compressed pickle (flags 1 | 8)
    cluster = Cluster([server.spec], serde=ValueSerde(on_refused=recorder))
    assert cluster.get("shared:2") == value  # zlib is read without configuration
    assert cluster.get_many(["shared:2"]) == {"shared:2": value}
    assert peer.get("shared:2") == value
    assert recorder.reasons == []
    peer.disconnect_all()
    cluster.close()


def test_an_embedded_store_leaves_a_refused_item_in_place(
    clock: FakeClock, recorder: Recorder
) -> None:
    store = MemoryStore(serde=ValueSerde(on_refused=recorder), clock=clock)
    plant(store, "shared", b"\xac\xed\x00\x05t\x00\x03ann", 1)
    item = store._items[b"shared"]
    assert store.get("shared") is None
    assert store.gets("shared") == (None, None)
    assert store.get_many(["shared"]) == {}
    assert store._items[b"shared"] is item  # the very same item: nothing rewrote it
    assert recorder.reasons == ["corrupt"] * 3
    assert store.add("shared", 1) is False
    assert store.set("shared", 1)
    assert store.get("shared") == 1
