"""`MergedStreams`: several request streams consumed as one, for `n` choices or prompts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from runtime.wire.request_output import RequestOutput

T = TypeVar("T")
Guard = Callable[[Awaitable[T]], Awaitable[T]]  # awaits, or raises if the client leaves
_DONE = object()


class MergedStreams:
    """Runs each `TokenizerManager.generate` stream in a task; yields `(index, output)` in
    arrival order. The first error of any stream is raised to the consumer; `aclose`
    cancels the streams still running, which aborts their requests.

    A single stream (the usual request) is read directly, without a task and a queue:
    its consumer wakes once per scheduler step, not twice."""

    def __init__(self, streams: Sequence[AsyncIterator[RequestOutput]]) -> None:
        self._single = streams[0] if len(streams) == 1 else None
        self._queue: asyncio.Queue = asyncio.Queue()
        self._live = len(streams)
        self._tasks = [] if self._single is not None else [
            asyncio.create_task(self._pump(i, s), name=f"choice-{i}")
            for i, s in enumerate(streams)]

    async def _pump(self, index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    self._queue.put_nowait((index, out))
        except Exception as e:  # InvalidRequest, Overloaded, ServerError: the consumer's call
            self._queue.put_nowait((index, e))
            return
        self._queue.put_nowait((index, _DONE))

    def __aiter__(self) -> MergedStreams:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        if self._single is not None:
            return 0, await anext(self._single)
        while self._live:
            index, item = await self._queue.get()
            if item is _DONE:
                self._live -= 1
                continue
            if isinstance(item, Exception):
                raise item
            return index, item
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Cancel every stream still running and wait for them to unwind."""
        if self._single is not None:
            await self._single.aclose()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def start_streams(streams: Sequence[AsyncIterator[RequestOutput]],
                        guard: Guard) -> tuple[MergedStreams, tuple[int, RequestOutput]]:
    """Start the streams and await the first output under `guard`: a request rejected up
    front (invalid, overloaded, failed by the scheduler) raises here, before a response
    has started. On any error every stream is closed."""
    merged = MergedStreams(streams)
    try:
        return merged, await guard(anext(merged))
    except BaseException:
        await merged.aclose()
        raise


async def collect(merged: MergedStreams) -> list[tuple[int, RequestOutput]]:
    """Every remaining `(index, output)` of the streams, in arrival order."""
    return [item async for item in merged]


@dataclass
class EventStream:
    """A response body of server-sent events and the streams behind it: whoever serves it
    must `aclose` the streams when done, even if the body was never iterated (a client
    gone before the response started), or the requests would run on unread."""

    events: AsyncIterator[bytes]
    streams: MergedStreams
