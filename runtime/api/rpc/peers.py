"""`RpcPeers`: the RPC socket's TCP connections, counted from its socket monitor, and a cap.

ZeroMQ accepts any number of peers and offers no per-peer close, so a monitor reports
each connection as it is accepted (with its file descriptor) and as it goes. One
accepted beyond `cap` is shut down at once, before its handshake: zmq sees it end and
cleans up as for any peer that left. The descriptor is checked to still be a connection
to our own port first (not the listening socket), since zmq may already have closed it
and the number been reused.

Every disconnection is reported to `on_disconnect`: a client that vanished cannot be told
apart by its routing id, so the server looks which of its clients still answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)
EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED


class RpcPeers:
    """Counts the connections of the bound `sock` (asyncio ROUTER) and closes those beyond
    `cap`; `on_disconnect()` runs on the loop after each one ends."""

    def __init__(self, sock: zmq.asyncio.Socket, cap: int,
                 on_disconnect: Callable[[], None]) -> None:
        self.cap = cap
        self.refused = 0  # connections closed for being beyond the cap
        self._sock = sock
        self._on_disconnect = on_disconnect
        self._open: set[int] = set()  # the descriptors of the open connections
        self._monitor = sock.get_monitor_socket(EVENTS)
        self._port = int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self._task = asyncio.create_task(self._watch(), name="rpc-peers")

    @property
    def num_open(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._sock.disable_monitor()
        self._monitor.close(linger=0)

    async def _watch(self) -> None:
        while True:
            event = parse_monitor_message(await self._monitor.recv_multipart())
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._open.add(fd)
                if len(self._open) > self.cap:
                    self._refuse(fd)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._open.discard(fd)
                self._on_disconnect()

    def _refuse(self, fd: int) -> None:
        """Shut the connection on `fd` down (zmq then closes it), if it is still ours."""
        with contextlib.suppress(OSError):
            conn = socket.socket(fileno=fd)
            try:
                if conn.type != socket.SOCK_STREAM or conn.getsockname()[1] != self._port:
                    return
                conn.getpeername()  # raises for the listening socket
                conn.shutdown(socket.SHUT_RDWR)
                self.refused += 1
                if self.refused % 1000 == 1:  # the first of a flood, then every 1000th
                    log.warning("closing an RPC connection: %d open (max_rpc_connections=%d)",
                                len(self._open), self.cap)
            finally:
                conn.detach()  # zmq owns the descriptor

