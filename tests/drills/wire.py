"""Parse what a client sent to memcached (text protocol) and refuse anything malformed.

The bad-input drills route every backend through :class:`~tests.drills.proxy.Proxy`
and then check each recorded stream with :func:`check_requests`: every command
is one memcached knows, every key obeys protocol.txt ("the key must not include
control characters or whitespace", at most 250 bytes), every storage command's
data block has exactly the announced length and its ``\\r\\n``.  A key with a
space or a newline that slipped through would show here as an unknown command
or a bad token.  :func:`check_replies` checks that memcached never answered
``ERROR`` or a ``CLIENT_ERROR`` we did not expect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY = re.compile(rb"[^\x00-\x20\x7f]{1,250}")
NUMBER = re.compile(rb"-?[0-9]+")
UNSIGNED = re.compile(rb"[0-9]+")

STORAGE = frozenset({b"set", b"add", b"replace", b"append", b"prepend", b"cas"})
RETRIEVAL = frozenset({b"get", b"gets"})
TOUCHING_RETRIEVAL = frozenset({b"gat", b"gats"})
META = frozenset({b"mg", b"md", b"ma", b"ms", b"mn"})
BARE = frozenset({b"version", b"quit", b"stats", b"flush_all", b"verbosity"})

# Error replies that are answers to a well-formed request, not protocol errors.
EXPECTED_ERRORS = (
    b"CLIENT_ERROR cannot increment or decrement non-numeric value",
    b"SERVER_ERROR object too large for cache",
    b"SERVER_ERROR out of memory storing object",
)


class WireError(AssertionError):
    """Something malformed reached memcached."""


@dataclass(frozen=True)
class Command:
    name: bytes
    keys: tuple[bytes, ...]
    data: bytes | None = None


def _key(token: bytes, line: bytes) -> bytes:
    if not KEY.fullmatch(token):
        raise WireError(f"invalid key {token[:60]!r} in {line[:80]!r}")
    return token


def _numbers(tokens: list[bytes], pattern: re.Pattern[bytes], line: bytes) -> None:
    for token in tokens:
        if token != b"noreply" and not pattern.fullmatch(token):
            raise WireError(f"bad number {token[:40]!r} in {line[:80]!r}")


def parse_requests(stream: bytes) -> list[Command]:
    """Every command of one connection's client-to-server bytes; raise :class:`WireError`."""
    commands: list[Command] = []
    pos = 0
    while pos < len(stream):
        end = stream.find(b"\r\n", pos)
        if end < 0:
            break  # a connection cut mid-request by a drill leaves a tail without CRLF
        line = stream[pos:end]
        pos = end + 2
        if b"\n" in line or b"\r" in line or b"\x00" in line:
            raise WireError(f"control byte inside a command line: {line[:80]!r}")
        tokens = line.split(b" ")
        name, args = tokens[0], tokens[1:]
        if any(not token for token in tokens):
            raise WireError(f"empty token (double space) in {line[:80]!r}")
        if name in STORAGE:
            wanted = 5 if name == b"cas" else 4
            if len(args) not in (wanted, wanted + 1):
                raise WireError(f"wrong argument count in {line[:80]!r}")
            key = _key(args[0], line)
            _numbers(args[1:2] + args[3:], UNSIGNED, line)
            _numbers(args[2:3], NUMBER, line)
            if int(args[1]) >= 2**32:
                raise WireError(f"flags out of range in {line[:80]!r}")
            size = int(args[3])
            data = stream[pos : pos + size]
            if len(data) < size:
                break  # cut mid-data by a drill
            if stream[pos + size : pos + size + 2] not in (b"\r\n", b"\r", b""):
                raise WireError(f"data block of {key!r} is not {size} bytes + CRLF")
            pos += size + 2
            commands.append(Command(name, (key,), data))
        elif name in RETRIEVAL or name in TOUCHING_RETRIEVAL:
            keys = args[1:] if name in TOUCHING_RETRIEVAL else args
            if not keys:
                raise WireError(f"retrieval without a key: {line[:80]!r}")
            commands.append(Command(name, tuple(_key(k, line) for k in keys)))
        elif name == b"delete":
            if len(args) not in (1, 2):
                raise WireError(f"wrong argument count in {line[:80]!r}")
            commands.append(Command(name, (_key(args[0], line),)))
        elif name in (b"incr", b"decr", b"touch"):
            if len(args) not in (2, 3):
                raise WireError(f"wrong argument count in {line[:80]!r}")
            _numbers(args[1:], UNSIGNED if name != b"touch" else NUMBER, line)
            commands.append(Command(name, (_key(args[0], line),)))
        elif name in META:
            if name == b"ms":  # ms <key> <datalen> <flags>*: a data block follows
                if len(args) < 2:
                    raise WireError(f"wrong argument count in {line[:80]!r}")
                _numbers(args[1:2], UNSIGNED, line)
                size = int(args[1])
                data = stream[pos : pos + size]
                if len(data) < size:
                    break  # cut mid-data by a drill
                pos += size + 2
                commands.append(Command(name, (_key(args[0], line),), data))
            elif name != b"mn":
                commands.append(Command(name, (_key(args[0], line),)))
        elif name in BARE:
            commands.append(Command(name, ()))
        else:
            raise WireError(f"unknown command {name[:40]!r} in {line[:80]!r}")
    return commands


def check_requests(streams: list[bytes]) -> list[Command]:
    """Parse every connection's stream; return all the commands, or raise :class:`WireError`."""
    return [command for stream in streams for command in parse_requests(stream)]


def check_replies(streams: list[bytes]) -> None:
    """Raise :class:`WireError` when memcached answered ``ERROR``/an unexpected error line."""
    for stream in streams:
        pos = 0
        while pos < len(stream):
            end = stream.find(b"\r\n", pos)
            if end < 0:
                break
            line = stream[pos:end]
            pos = end + 2
            if line.startswith(b"VALUE "):
                pos += int(line.split(b" ")[3]) + 2  # skip the data block
            elif line.startswith(b"VA "):
                pos += int(line.split(b" ")[1]) + 2
            elif line == b"ERROR" or (
                line.startswith((b"CLIENT_ERROR", b"SERVER_ERROR"))
                and not line.startswith(EXPECTED_ERRORS)
            ):
                raise WireError(f"memcached answered {line[:80]!r}")
