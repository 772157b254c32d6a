"""`GuardedH11Protocol`: uvicorn's HTTP/1.1 protocol with a read deadline and a connection cap.

uvicorn closes a keep-alive connection that stays idle between requests, but not one that
is slow to send a request: a client that connects and sends nothing, or drips its headers
or body a byte at a time (slowloris), holds a connection and its file descriptor for as
long as it likes. Here a request must arrive whole (headers and body) within
`read_timeout` seconds of its first byte (of the connection, for the first request), and
a connection opened beyond `max_connections` is closed at once. Either way the connection
is just closed: HTTP has no response before a request has been read.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


class GuardedH11Protocol(H11Protocol):
    """`H11Protocol` plus the deadline and the cap; build it with
    `functools.partial(GuardedH11Protocol, read_timeout=..., max_connections=...)`."""

    def __init__(
        self, *args: Any, read_timeout: float, max_connections: int, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.debug("closing a connection: %d open (max_connections)", len(self.connections))
            transport.abort()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.trailing_data[0]:  # a pipelined request has begun to arrive
            self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Keep the deadline while a request is partly read; drop it once it is whole."""
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            if self._deadline is None:
                self._arm()
        else:
            self._disarm()

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.read_timeout, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.debug(
                "closing a connection from %s: no whole request in %s s",
                self.client,
                self.read_timeout,
            )
            self.transport.abort()


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit; return the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # some platforms cap it lower than the hard limit
            pass
    return soft
