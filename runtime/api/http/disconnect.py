"""A client that disconnects aborts its requests: while an SSE response streams, Starlette
stops it and `SseResponse` closes the request streams behind it; before that (waiting
for the first token, or for a whole non-streamed response) `disconnect_guard`, a watcher
on the ASGI `receive` channel, cancels the work and raises `ClientGone`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from runtime.api.streams import EventStream

T = TypeVar("T")


class ClientGone(Exception):
    """The HTTP client disconnected before its response started."""


def disconnect_guard(request: Request) -> Callable[[Awaitable[T]], Awaitable[T]]:
    """Await something, but cancel it and raise `ClientGone` if the client disconnects."""

    async def guard(aw: Awaitable[T]) -> T:
        work = asyncio.ensure_future(aw)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
        if work.cancelled():
            raise ClientGone
        return work.result()

    return guard


async def _disconnected(request: Request) -> None:
    """Return when the client disconnects (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class SseResponse(StreamingResponse):
    """Streams an EventStream; closes its request streams however the response ends."""

    def __init__(self, body: EventStream) -> None:
        super().__init__(body.events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._streams = body.streams

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._streams.aclose()
