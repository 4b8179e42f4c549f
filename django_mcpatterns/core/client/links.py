"""A server's asyncio channels: one per event loop, opened on first use, dropped after a fork."""

from __future__ import annotations

import asyncio
from typing import Any

from ..exceptions import ProtocolError
from ..loops import at_shutdown
from ..protocol.wire import ErrorReply, Request
from .channel import Channel, open_channel
from .transport import ConnectionClosedError, SocketOptions

__all__ = ["Links", "answer"]


class Links:
    """One server's channels, one per event loop, owned by this process.

    Shared by every AsyncCluster over the same server node (a twin and its
    strict view).  Channels of closed loops are dropped when another loop
    opens one; a forked child forgets its parent's without touching them
    (:meth:`after_fork`: closing them there would be harmless to the parent,
    but their loop is the parent's, and its selector is shared with the parent).
    """

    __slots__ = ("_connecting", "address", "channels", "options")

    def __init__(self, address: str | tuple[str, int], options: SocketOptions) -> None:
        self.address = address
        self.options = options
        self.channels: dict[asyncio.AbstractEventLoop, Channel] = {}
        self._connecting: dict[asyncio.AbstractEventLoop, asyncio.Future[Channel]] = {}

    def current(self, loop: asyncio.AbstractEventLoop) -> Channel | None:
        """This loop's open channel, if any (the hot path: no await)."""
        channel = self.channels.get(loop)
        if channel is not None and channel.broken is None:
            return channel
        return None

    async def channel(self, loop: asyncio.AbstractEventLoop) -> Channel:
        """This loop's channel, connecting first if needed (concurrent callers share it)."""
        channel = self.current(loop)
        if channel is not None:
            return channel
        connecting = self._connecting.get(loop)
        if connecting is None:
            # A task of its own: a cancelled caller does not abort others' connect.
            connecting = loop.create_task(self._connect(loop))
            connecting.add_done_callback(_retrieved)  # callers may all have been cancelled
            self._connecting[loop] = connecting
        return await asyncio.shield(connecting)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> Channel:
        try:
            channel = await open_channel(self.address, self.options)
        finally:
            self._connecting.pop(loop, None)
        # Loops of other threads may connect at the same time: each step is one dict
        # operation (atomic), and a closed loop's channel is ended by whoever pops it.
        for old in [other for other in list(self.channels) if other.is_closed()]:
            abandoned = self.channels.pop(old, None)
            if abandoned is not None:
                abandoned.abandon()  # its loop is gone: nothing can use it
        self.channels[loop] = channel
        await at_shutdown(self, self._shut)
        return channel

    async def _shut(self) -> None:
        """End the channel of a loop that shuts down (:mod:`..loops`), rather than leave it
        to the garbage collector."""
        channel = self.channels.pop(asyncio.get_running_loop(), None)
        if channel is not None:
            channel.fail(ConnectionClosedError("its event loop shut down"))
            await asyncio.sleep(0)  # the transport's connection_lost closes the socket

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close this loop's channel (once idle: requests held are answered first)."""
        channel = self.channels.pop(loop, None)
        if channel is not None:
            channel.close()

    def after_fork(self) -> None:
        """In a forked child: forget the parent's channels, never using or touching them."""
        _inherited.extend(self.channels.values())
        self.channels = {}
        self._connecting = {}


def _retrieved(task: asyncio.Task[Channel]) -> None:
    """Mark a connect's failure as seen: its callers judge it, or were cancelled."""
    if not task.cancelled():
        task.exception()


# Channels a forked child inherited: kept referenced so their garbage collection
# does not touch the parent's event loop objects; the process exit closes them.
_inherited: list[Channel] = []


async def answer(links: Links, request: Request[Any]) -> Any:
    """``request``'s reply on a new connection; None when refused (ERROR or closed) or down."""
    try:
        channel = await open_channel(links.address, links.options)
    except (OSError, ProtocolError):
        return None
    try:
        (reply,) = await channel.submit((request,))
    except (OSError, ProtocolError):
        return None
    finally:
        channel.close()
    if type(reply) is ErrorReply and reply.kind == "ERROR":
        return None
    return reply
